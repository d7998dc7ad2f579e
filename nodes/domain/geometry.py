"""A model's KV-cache geometry from its ``config.json``: bytes per token on one rank.

Formulas from shared/reference/sglang.md §2–§3 (``model_runner.py``, ``memory_pool.py``):
MHA/GQA ``2 × max(1, kv_heads // tp) × head_dim × layers/pp × elem``; MLA (DeepSeek-V2/V3,
Kimi-K2) ``(kv_lora_rank + qk_rope_head_dim) × layers/pp × elem``, replicated on every TP rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class GeometryError(ValueError):
    """The config lacks what the KV size needs; the message names the missing key."""


@dataclass(frozen=True)
class ModelGeometry:
    """What the KV pool depends on. ``kv_lora_rank`` set means MLA."""

    layers: int
    attention_heads: int | None  # None when config.json does not say (only checks need it)
    kv_heads: int
    head_dim: int
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    torch_dtype: str = "bfloat16"

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None


def from_config(config: dict[str, Any]) -> ModelGeometry:
    """Read a Hugging Face ``config.json`` (multimodal ones through ``text_config``).

    Raises ``GeometryError`` naming the first missing key.
    """
    if not isinstance(config, dict):
        raise GeometryError("config.json is not a JSON object")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    source = {**config, **(text or {})}

    def need(key: str) -> int:
        if key not in source or source[key] is None:
            raise GeometryError(f"config.json has no {key}")
        return _count(key, source[key])

    heads = need("num_attention_heads") if source.get("num_attention_heads") else None
    layers = need("num_hidden_layers")
    if source.get("kv_lora_rank") is not None:
        return ModelGeometry(
            layers,
            heads,
            heads or 1,
            0,
            need("kv_lora_rank"),
            need("qk_rope_head_dim"),
            str(source.get("torch_dtype", "bfloat16")),
        )
    kv_heads = (
        need("num_key_value_heads") if source.get("num_key_value_heads") else heads
    ) or need("num_key_value_heads")
    head_dim = (
        need("head_dim") if source.get("head_dim") else need("hidden_size") // (heads or kv_heads)
    )
    if head_dim < 1:
        raise GeometryError("config.json gives a head dimension below 1")
    return ModelGeometry(
        layers, heads, kv_heads, head_dim, torch_dtype=str(source.get("torch_dtype", "bfloat16"))
    )


def _count(key: str, value: Any) -> int:
    """A positive whole number from config.json, or ``GeometryError`` naming the key."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise GeometryError(f"config.json {key} is not a number")
    if not 1 <= value <= 10**7 or value != int(value):
        raise GeometryError(f"config.json {key} = {value} is not a plausible count")
    return int(value)


def kv_elem_bytes(kv_cache_dtype: str, torch_dtype: str = "bfloat16") -> int:
    """Bytes per KV element: fp8 kinds 1; ``auto`` follows the model dtype (bf16/fp16 2)."""
    if kv_cache_dtype.startswith(("fp8", "mxfp8", "fp4", "nvfp4")):
        return 1
    return 4 if kv_cache_dtype == "auto" and torch_dtype in ("float32", "float") else 2


def kv_bytes_per_token(geometry: ModelGeometry, tp: int, pp: int, elem: int) -> int:
    """KV bytes per token on one rank, for ``tp`` × ``pp`` and element size ``elem`` bytes."""
    layers = -(-geometry.layers // pp)
    if geometry.is_mla:
        assert geometry.kv_lora_rank is not None and geometry.qk_rope_head_dim is not None
        return (geometry.kv_lora_rank + geometry.qk_rope_head_dim) * layers * elem
    return 2 * max(1, geometry.kv_heads // tp) * geometry.head_dim * layers * elem
