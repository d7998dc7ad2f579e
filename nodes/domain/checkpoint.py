"""Weights per rank from a checkpoint's safetensors headers, tensor by tensor, by SGLang's
loading rules (shared/reference/sglang.md §3b).

Input: groups ``(name pattern, dtype, shape, count)`` as ``nodes/remote/model_headers.py``
prints them (layer and expert numbers replaced by ``*``). The header's dtypes and shapes are the
stored bytes, so quantized formats need no special arithmetic, only their tensor names:
compressed-tensors INT4 (``weight_packed`` I32, ``weight_scale``, ``weight_shape``), FP8 block
(``weight`` F8_E4M3 + ``weight_scale_inv`` F32), AWQ/GPTQ (``qweight``, ``qzeros``, ``scales``,
``g_idx``), NVFP4 (``weight`` U8, ``weight_scale`` F8, ``weight_scale_2``/``input_scale`` F32).

Sharding by module (SGLang's layer classes):

* **replicated** (whole on every rank): ``q_a_proj``/``kv_a_proj_with_mqa`` (fused into a
  ``ReplicatedLinear``, ``deepseek_v2.py:1122``), the MoE router ``mlp.gate`` and its
  ``e_score_correction_bias`` (``deepseek_v2.py:294-306``; Qwen MoE's gate likewise), norms,
  scalar scales, the vision tower's MLP and the multimodal projector (``kimi_k25.py:557-568``);
* **KV heads** (``k_proj``/``v_proj``, fused ``qkv_proj``'s KV part is not split out): sharded by
  heads, replicated when TP exceeds the KV heads: × max(1, kv_heads // tp) / kv_heads;
* **everything else**: column/row parallel, vocab-parallel embedding and ``lm_head``, experts
  under TP or EP (each rank ends up with 1/tp of the expert bytes either way): ÷ tp.

Then ``w_kc``/``w_vc`` copies and the allocator slack from ``nodes.domain.weights``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from nodes.domain.units import format_bytes
from nodes.domain.weights import (
    ALLOCATOR_SLACK_BYTES,
    WeightsEstimate,
    config_int,
    kv_b_copies,
    text_config,
)

DTYPE_BYTES = {
    "F64": 8.0,
    "I64": 8.0,
    "U64": 8.0,
    "F32": 4.0,
    "I32": 4.0,
    "U32": 4.0,
    "F16": 2.0,
    "BF16": 2.0,
    "I16": 2.0,
    "U16": 2.0,
    "F8_E4M3": 1.0,
    "F8_E5M2": 1.0,
    "F8_E8M0": 1.0,
    "I8": 1.0,
    "U8": 1.0,
    "BOOL": 1.0,
    "F4": 0.5,
    "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
}
_REPLICATED = re.compile(
    r"(q_a_proj|kv_a_proj_with_mqa|q_a_layernorm|kv_a_layernorm|\.mlp\.gate\.|"
    r"\.gate\.weight$|e_score_correction_bias|norm|weight_shape$|_scale_2$|input_scale$|"
    r"(vision_tower|vision_model|visual).*\.mlp\.|mm_projector|multi_modal_projector)"
)
_KV_HEADS = re.compile(r"\.(k_proj|v_proj)\.")

Group = Sequence[Any]  # (pattern: str, dtype: str, shape: list[int], count: int)


class HeaderError(ValueError):
    """A header group that is not (name, known dtype, shape of whole numbers, count)."""


def tensor_bytes(dtype: str, shape: Sequence[int]) -> int:
    """Bytes of one stored tensor; raises ``HeaderError`` for an unknown dtype."""
    if dtype not in DTYPE_BYTES:
        raise HeaderError(f"unknown safetensors dtype {dtype}")
    elements = 1
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise HeaderError(f"shape {list(shape)} is not a list of sizes")
        elements *= dim
    return int(elements * DTYPE_BYTES[dtype])


def per_rank(
    groups: Iterable[Group], config: dict[str, Any] | None, tp: int, pp: int = 1
) -> WeightsEstimate:
    """Weights per rank from the header groups; raises ``HeaderError`` for malformed groups."""
    text = text_config(config)
    kv_heads = config_int(text, "num_key_value_heads") or config_int(text, "num_attention_heads")
    kv_share = max(1, kv_heads // tp) / kv_heads if kv_heads else 1 / tp
    total = replicated = sharded = heads = 0
    for group in groups:
        if not isinstance(group, list | tuple) or len(group) != 4:
            raise HeaderError("a header group is not [name, dtype, shape, count]")
        name, dtype, shape, count = group
        if not isinstance(name, str) or not isinstance(count, int) or count < 0:
            raise HeaderError("a header group has no name or count")
        size = tensor_bytes(str(dtype), shape) * count
        total += size
        if _REPLICATED.search(name):
            replicated += size
        elif _KV_HEADS.search(name):
            heads += size
        else:
            sharded += size
    copies = kv_b_copies(text, tp)
    body = sharded // tp + int(heads * kv_share) + replicated
    result = body // pp + copies // pp + ALLOCATOR_SLACK_BYTES
    lines = (
        f"safetensors headers: {format_bytes(total, 'GB', places=2)} in all",
        f"  sharded ÷ tp {tp}: {format_bytes(sharded, 'GB', places=2)} → "
        f"{format_bytes(sharded // tp, places=2)}",
        f"  KV-head projections (× {kv_share:.4g}): "
        f"{format_bytes(int(heads * kv_share), places=2)}",
        f"  replicated on every rank (fused q_a/kv_a, router, norms, vision MLP, projector): "
        f"{format_bytes(replicated, places=2)}",
        *((f"  ÷ pp {pp}",) if pp > 1 else ()),
        *(
            (f"  + w_kc/w_vc copies of kv_b_proj: {format_bytes(copies, places=2)}",)
            if copies
            else ()
        ),
        f"  + allocator slack {format_bytes(ALLOCATOR_SLACK_BYTES, places=2)}",
        f"  = {format_bytes(result, places=2)} per rank",
    )
    return WeightsEstimate(result, lines)
