"""Weights per rank from the checkpoint size and ``config.json``, by SGLang's loading rules.

SGLang does not hold checkpoint ÷ TP on each rank (shared/reference/sglang.md §3b):

* **Replicated tensors** are whole on every rank: DeepSeek-V3-family MLA (DeepSeek-V3/R1,
  Kimi-K2/K2.5, GLM MLA models) fuses ``q_a_proj`` + ``kv_a_proj_with_mqa`` into a
  ``ReplicatedLinear`` (``models/deepseek_v2.py:1122``); the MoE router ``gate.weight`` is
  replicated (``deepseek_v2.py:294-306``, Qwen MoE likewise); Kimi-K2.5's MoonViT MLP
  (``nn.Linear``) and its projector (``ReplicatedLinear``, ``models/kimi_k25.py:557-568``).
  Per rank they add ``replicated × (1 − 1/tp)`` to ``checkpoint ÷ tp``.
* **Copies kept after loading**: ``w_kc``/``w_vc`` copy ``kv_b_proj`` on each rank
  (``deepseek_weight_loader.py:556-576``): heads/tp × (qk_nope + v_head) × kv_lora_rank × layers
  × 2 B.
* **Allocator slack** ≈ 0.6 GiB per rank after loading (residual against a measured log).

Checked: Kimi-K2.5 INT4, 595 GB at TP8 → 72.3 GiB per rank (logged: 72.42 GiB, S01).
Only the replicated parts need ``config.json``; the rest is the checkpoint's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodes.domain.units import GiB, format_bytes

ALLOCATOR_SLACK_BYTES = int(0.6 * GiB)
BF16 = 2


@dataclass(frozen=True)
class WeightsEstimate:
    """Bytes of weights on one rank and the arithmetic behind them, line by line."""

    bytes_per_rank: int
    lines: tuple[str, ...]


def per_rank(
    checkpoint_bytes: int, config: dict[str, Any] | None, tp: int, pp: int
) -> WeightsEstimate:
    """Weights per rank for a checkpoint of ``checkpoint_bytes`` split over ``tp`` × ``pp``.

    ``config`` is the model's ``config.json`` (None: only the split and the slack are known).
    Never raises for odd configs: a key that is missing or not a number counts as absent.
    """
    text = text_config(config)
    replicated = _replicated(text, config or {})
    copies = kv_b_copies(text, tp)
    shard = checkpoint_bytes // (tp * pp)
    extra = (sum(size for _, size in replicated) * (tp - 1) // tp + copies) // pp
    total = shard + extra + ALLOCATOR_SLACK_BYTES
    lines = [
        f"checkpoint {format_bytes(checkpoint_bytes, 'GB')} ÷ (tp {tp} × pp {pp}) = "
        f"{format_bytes(shard, places=2)}"
    ]
    for name, size in replicated:
        lines.append(
            f"  + {name} replicated on every rank: {format_bytes(size, 'GB', places=2)} × "
            f"(1 − 1/{tp})" + (f" ÷ pp {pp}" if pp > 1 else "")
        )
    if copies:
        lines.append(f"  + w_kc/w_vc copies of kv_b_proj: {format_bytes(copies, 'GB', places=2)}")
    lines.append(f"  + allocator slack {format_bytes(ALLOCATOR_SLACK_BYTES, places=2)}")
    lines.append(f"  = {format_bytes(total, places=2)} per rank")
    return WeightsEstimate(total, tuple(lines))


def text_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """A ``config.json`` with its ``text_config`` (multimodal models) laid over it."""
    if not isinstance(config, dict):
        return {}
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def config_int(source: dict[str, Any], key: str) -> int:
    """``source[key]`` when it is a plausible positive count (below 10^7), else 0."""
    value = source.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 10**7:
        return 0
    return value


def _attention_elem(text: dict[str, Any]) -> float:
    """Bytes per attention weight: FP8-block checkpoints 1; others bf16 unless quantized
    attention (INT4 compressed-tensors/AWQ/GPTQ without an attention ``ignore``)."""
    quant = text.get("quantization_config")
    if not isinstance(quant, dict):
        return BF16
    method = str(quant.get("quant_method", ""))
    if method == "fp8":
        return 1
    ignore = quant.get("ignore") or quant.get("modules_to_not_convert") or []
    if any("attn" in str(entry) for entry in ignore if isinstance(ignore, list)):
        return BF16
    if method in ("compressed-tensors", "awq", "gptq"):
        return 0.5625  # 4-bit with a bf16 scale per 32 values
    return BF16


def _replicated(text: dict[str, Any], config: dict[str, Any]) -> list[tuple[str, int]]:
    found = []
    hidden = config_int(text, "hidden_size")
    layers = config_int(text, "num_hidden_layers")
    kv_lora = config_int(text, "kv_lora_rank")
    if kv_lora and hidden and layers:
        fused = config_int(text, "q_lora_rank") + kv_lora + config_int(text, "qk_rope_head_dim")
        size = int(fused * hidden * layers * _attention_elem(text))
        name = "fused q_a/kv_a projection" if config_int(text, "q_lora_rank") else "kv_a projection"
        found.append((name, size))
    experts = config_int(text, "n_routed_experts") or config_int(text, "num_experts")
    if experts and hidden and layers:
        moe_layers = layers - config_int(text, "first_k_dense_replace")
        found.append(("MoE router", experts * hidden * moe_layers * BF16))
    vision = config.get("vision_config")
    if isinstance(vision, dict) and vision.get("model_type") == "moonvit" and hidden:
        v_hidden, v_layers = (
            config_int(vision, "hidden_size"),
            config_int(vision, "num_hidden_layers"),
        )
        mlp = v_layers * 2 * v_hidden * config_int(vision, "intermediate_size") * BF16
        merged = 4 * v_hidden  # 2 × 2 patch merge before the projector
        projector = (merged * merged + merged * hidden) * BF16
        found.append(("MoonViT MLP and projector", mlp + projector))
    return found


def kv_b_copies(text: dict[str, Any], tp: int) -> int:
    """Bytes of the w_kc/w_vc copies SGLang keeps of kv_b_proj on one rank (MLA only, else 0)."""
    heads = config_int(text, "num_attention_heads")
    kv_lora = config_int(text, "kv_lora_rank")
    per_head = config_int(text, "qk_nope_head_dim") + config_int(text, "v_head_dim")
    layers = config_int(text, "num_hidden_layers")
    if not (heads and kv_lora and per_head and layers):
        return 0
    return max(1, heads // tp) * per_head * kv_lora * layers * BF16
