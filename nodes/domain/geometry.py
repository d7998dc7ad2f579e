"""A model's KV-cache geometry from its ``config.json``: bytes per token on one rank.

Formulas from shared/reference/sglang.md §2–§3 (``model_runner.py``, ``memory_pool.py``):
MHA/GQA ``2 × max(1, kv_heads // tp) × head_dim × layers/pp × elem``; MLA (DeepSeek-V2/V3,
Kimi-K2) ``(kv_lora_rank + qk_rope_head_dim) × layers/pp × elem``, replicated on every TP rank.

Layouts of 2025–2026 (checked against the logged bytes per token of
shared/reference/kv-observations.json):

* **Hybrid linear-attention / Mamba** (Qwen3-Next/Qwen3.5 GDN, LFM2, Nemotron-H): only the
  full-attention layers keep KV (K28: 8 of 32 layers); a per-request state pool shares the
  budget (``--mamba-full-memory-ratio``, see ``budget``).
* **Sliding-window layers** (gpt-oss, MiMo-V2): ``layer_types`` names them; SGLang keeps a
  full pool and a smaller SWA pool (``--swa-full-tokens-ratio``).
* **DSA / NSA indexer** (DeepSeek-V3.2, GLM-5): every layer adds the indexer's key, fp8 with
  one fp32 scale per 128 values (K17, K31: 132 B per layer for index_head_dim 128); with fp8 KV
  the MLA latent is stored with its scales (656 B per layer for 512 + 64).

A layout the engine does not know (state layers it cannot place) is not guessed:
``ModelGeometry.unknown_layout`` says why, and the budget reports "estimate unavailable".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
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
    #: Layers keeping KV when fewer than ``layers`` do (hybrid models); None: all of them.
    attention_layers: int | None = None
    #: Layers with a per-request state instead of KV (linear attention, Mamba, short conv).
    state_layers: int = 0
    #: Sliding-window layers among the attention layers (SGLang's SWA pool).
    swa_layers: int = 0
    #: The DSA/NSA indexer's key dimension (DeepSeek-V3.2, GLM-5), cached per token and layer.
    index_head_dim: int | None = None
    #: Why the KV pool cannot be estimated for this layout; None when it can.
    unknown_layout: str | None = None
    #: What the replicated weights and copies need (``nodes.domain.weights``); None if unknown.
    config: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    #: The checkpoint's safetensors header groups ``[pattern, dtype, shape, count]`` when they
    #: were read (``nodes.domain.checkpoint``), else None and ``headers_note`` says why.
    tensors: tuple[Any, ...] | None = field(default=None, compare=False, repr=False)
    headers_note: str = field(default="", compare=False)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_hybrid(self) -> bool:
        """Linear-attention/Mamba layers with a state pool beside the KV pool."""
        return self.state_layers > 0

    @property
    def layout(self) -> str:
        """Words for the page: ``MLA``, ``GQA``, plus what else the pool holds."""
        parts = ["MLA" if self.is_mla else "MHA/GQA"]
        if self.index_head_dim:
            parts.append("DSA indexer")
        if self.state_layers:
            parts.append(
                f"hybrid: {self.attention_layers} attention + {self.state_layers} state layers"
            )
        if self.swa_layers:
            parts.append(f"{self.swa_layers} sliding-window layers")
        return ", ".join(parts)


def from_config(config: dict[str, Any]) -> ModelGeometry:
    """Read a Hugging Face ``config.json`` (multimodal ones through ``text_config``).

    A config with the standard attention keys is read whatever its ``architectures`` says.
    Raises ``GeometryError`` naming the first missing key; an unknown hybrid layout is returned
    with ``unknown_layout`` set rather than raised (the budget says why it cannot estimate).
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
    dtype = str(source.get("torch_dtype") or source.get("dtype") or "bfloat16")
    if source.get("kv_lora_rank") is not None:
        geometry = ModelGeometry(
            layers,
            heads,
            heads or 1,
            0,
            need("kv_lora_rank"),
            need("qk_rope_head_dim"),
            dtype,
        )
    else:
        kv_heads = (
            need("num_key_value_heads") if source.get("num_key_value_heads") else heads
        ) or need("num_key_value_heads")
        head_dim = (
            need("head_dim")
            if source.get("head_dim")
            else need("hidden_size") // (heads or kv_heads)
        )
        if head_dim < 1:
            raise GeometryError("config.json gives a head dimension below 1")
        geometry = ModelGeometry(layers, heads, kv_heads, head_dim, torch_dtype=dtype)
    index = source.get("index_head_dim")
    if index is not None and geometry.is_mla:
        geometry = replace(geometry, index_head_dim=_count("index_head_dim", index))
    return replace(_layers(geometry, source), config=config)


#: ``layer_types`` entries that keep a normal KV cache.
_ATTENTION_TYPES = {"full_attention", "attention", "global_attention"}
_SLIDING_TYPES = {"sliding_attention", "sliding_window_attention", "local_attention"}
#: Entries that keep a per-request state instead (SGLang's Mamba/state pool).
_STATE_TYPES = {"linear_attention", "mamba", "mamba2", "conv", "short_conv", "gated_deltanet"}
#: Keys that only hybrid state-space / linear-attention models carry.
_STATE_KEYS = (
    "linear_num_value_heads",
    "linear_conv_kernel_dim",
    "mamba_d_state",
    "ssm_state_size",
    "mamba_num_heads",
    "conv_L_cache",
    "attn_layer_period",
    "hybrid_override_pattern",
    "layers_block_type",
)


def _layers(geometry: ModelGeometry, source: dict[str, Any]) -> ModelGeometry:
    """Which layers keep KV, which a state, which a sliding window."""
    layers = geometry.layers
    types = source.get("layer_types")
    pattern = source.get("hybrid_override_pattern")
    interval = source.get("full_attention_interval")
    if isinstance(types, list) and types and all(isinstance(t, str) for t in types):
        if len(types) != layers:
            return replace(
                geometry,
                unknown_layout=f"layer_types lists {len(types)} layers, "
                f"num_hidden_layers says {layers}",
            )
        unknown = sorted({t for t in types} - _ATTENTION_TYPES - _SLIDING_TYPES - _STATE_TYPES)
        if unknown:
            return replace(
                geometry,
                unknown_layout=f"layer type {', '.join(unknown)} is not a layout the engine "
                "knows (which of its layers keep KV, and what state the others keep)",
            )
        attention = sum(t in _ATTENTION_TYPES or t in _SLIDING_TYPES for t in types)
        return replace(
            geometry,
            attention_layers=attention,
            state_layers=sum(t in _STATE_TYPES for t in types),
            swa_layers=sum(t in _SLIDING_TYPES for t in types),
        )
    if isinstance(pattern, str) and len(pattern) == layers:
        # Nemotron-H: "M" Mamba2, "*" attention, "-" MLP only (no cache).
        return replace(
            geometry, attention_layers=pattern.count("*"), state_layers=pattern.count("M")
        )
    if isinstance(interval, int) and not isinstance(interval, bool) and interval >= 1:
        # Qwen3-Next/Qwen3.5: every interval-th layer is full attention, the rest GDN.
        attention = layers // interval
        return replace(geometry, attention_layers=attention, state_layers=layers - attention)
    found = [key for key in _STATE_KEYS if source.get(key) is not None]
    if found:
        return replace(
            geometry,
            unknown_layout=f"config.json has {found[0]} (a hybrid state-space/linear-attention "
            "model) but no layer_types saying which layers keep KV",
        )
    return geometry


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
    """KV bytes per token on one rank, for ``tp`` × ``pp`` and element size ``elem`` bytes.

    ``tp`` is the attention TP size (tp ÷ dp under DP attention). Only the layers that keep KV
    count; sliding-window layers are counted as full here (``budget`` splits the two pools).
    """
    layers = -(-(geometry.attention_layers or geometry.layers) // pp)
    if geometry.is_mla:
        assert geometry.kv_lora_rank is not None and geometry.qk_rope_head_dim is not None
        latent = geometry.kv_lora_rank + geometry.qk_rope_head_dim
        per_layer = latent * elem
        if geometry.index_head_dim:
            if elem == 1:  # fp8 latent with fp32 scales per 128 values, rope kept in bf16
                per_layer = (
                    geometry.kv_lora_rank
                    + geometry.kv_lora_rank // 128 * 4
                    + geometry.qk_rope_head_dim * 2
                )
            per_layer += geometry.index_head_dim + geometry.index_head_dim // 128 * 4
        return per_layer * layers
    return 2 * max(1, geometry.kv_heads // tp) * geometry.head_dim * layers * elem
