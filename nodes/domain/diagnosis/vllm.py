"""Rules for failures only vLLM reports: the GPU's free memory below --gpu-memory-utilization, a
KV cache too small for --max-model-len."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from nodes.domain.diagnosis.evidence import (
    VLLM_DEFAULT_UTILIZATION,
    Bundle,
    Diagnosis,
    GiB,
    Hit,
    Rule,
    _fmt,
    _num,
)
from nodes.domain.geometry import GeometryError, from_config, kv_bytes_per_token, kv_elem_bytes

VLLM_FREE = re.compile(
    r"Free memory on device \S+ \((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) on startup is less "
    r"than desired GPU memory utilization \((?P<util>[\d.]+), (?P<want>[\d.]+) GiB\)"
)


def vllm_gpu_occupied(bundle: Bundle) -> Diagnosis | None:
    """vLLM (``gpu_worker.py``): the GPU's free memory at start is below what
    --gpu-memory-utilization asks for, because something else holds part of it."""
    hit = bundle.log.first(VLLM_FREE)
    if hit is None:
        return None
    free, total = _num(hit[1]["free"]), _num(hit[1]["total"])
    util, want = _num(hit[1]["util"]), _num(hit[1]["want"])
    others = round(total - free, 2)
    fits = math.floor(free / total * 1000) / 1000
    holders, held = _holders(bundle)
    return Diagnosis(
        category="gpu-occupied-by-other-process",
        secondary_categories=["mem-fraction-too-high"],
        summary=(
            f"GPU already partly occupied: {others:.2f} GiB held by another process{held}, so "
            f"{_fmt(util)} x {total:.2f} = {want:.2f} GiB > {free:.2f} GiB free (short by "
            f"{want - free:.2f} GiB)"
        ),
        remedy=(
            "stop the previous container/process holding the GPU (nvidia-smi "
            "--query-compute-apps shows it), cleanup GPU before launch, or lower "
            f"--gpu-memory-utilization to {math.floor(fits * 100) / 100:.2f} (at most {fits})"
        ),
        evidence=[bundle.evidence(hit)],
        numbers={
            "gpu_total_gib": total,
            "free_gib": free,
            "used_by_others_gib": others,
            "gpu_memory_utilization": util,
            "requested_gib": want,
            "shortfall_gib": round(want - free, 2),
            "max_util_that_fits": fits,
            **holders,
        },
    )


def _holders(bundle: Bundle) -> tuple[dict[str, float], str]:
    """The processes the earliest snapshot shows on the GPUs before the launch (its own are
    not there yet): MiB each and their sum, in words."""
    for snapshot in bundle.snapshots():
        rows = [r for r in snapshot.get("gpu_processes") or [] if r.get("used_memory_bytes")]
        if rows:
            mib = [round(r["used_memory_bytes"] / 2**20) for r in rows]
            names = ", ".join(f"PID {r.get('pid')} {r.get('name') or ''}".strip() for r in rows[:4])
            total = sum(mib)
            return {"holders_mib_total": total}, (
                f" ({names}: {' + '.join(map(str, mib))} = {total} MiB, before this launch "
                "started: processes left from an earlier server)"
            )
    return {}, ""


KV_TOO_SMALL = re.compile(
    r"max seq len \((?P<need>\d+)\) is larger than the maximum number of tokens that can be "
    r"stored in KV cache \((?P<have>\d+)\)"
)


GPU_BLOCKS = re.compile(r"# GPU blocks: (?P<blocks>\d+)")


@dataclass(frozen=True)
class GpuBlocks:
    """vLLM's ``# GPU blocks`` line: how many blocks, and the tokens each holds."""

    hit: Hit
    count: int
    size: int


@dataclass(frozen=True)
class KvTooSmall:
    """vLLM's KV cache holds ``have`` tokens, one request of the maximum length needs ``need``:
    with the GPU blocks when logged and the KV bytes per token on one GPU when the model's
    config gives them."""

    hit: Hit
    need: int
    have: int
    blocks: GpuBlocks | None
    per_token: int | None

    @property
    def suggested(self) -> int:
        """A little below the capacity (2 %), in round hundreds: one full-length request must
        fit."""
        return int(round(self.have * 0.98, -2))


def _kv_per_token(bundle: Bundle) -> int | None:
    """KV bytes per token on one GPU (TP 1, the model's dtype) from the model's config."""
    config = bundle.facts.get("model_config")
    if not isinstance(config, dict):
        return None
    try:
        geometry = from_config(config)
    except GeometryError:
        return None
    return kv_bytes_per_token(geometry, 1, 1, kv_elem_bytes("auto", geometry.torch_dtype))


def _kv_too_small(bundle: Bundle) -> KvTooSmall | None:
    hit = bundle.log.first(KV_TOO_SMALL)
    if hit is None:
        return None
    need, have = int(hit[1]["need"]), int(hit[1]["have"])
    blocks = None
    if (line := bundle.log.first(GPU_BLOCKS)) is not None:
        count = int(line[1]["blocks"])
        blocks = GpuBlocks(line, count, have // max(1, count))
    return KvTooSmall(hit, need, have, blocks, _kv_per_token(bundle))


def kv_cache_too_small(bundle: Bundle) -> Diagnosis | None:
    """vLLM: the KV cache holds fewer tokens than one request of the maximum length needs."""
    found = _kv_too_small(bundle)
    return None if found is None else _kv_too_small_diagnosis(bundle, found)


def _kv_too_small_diagnosis(bundle: Bundle, found: KvTooSmall) -> Diagnosis:
    need, have, per_token = found.need, found.have, found.per_token
    numbers: dict[str, float] = {
        "max_model_len": need,
        "kv_capacity_tokens": have,
        "tensor_parallel_size": bundle.tp(),
    }
    evidence = [bundle.evidence(found.hit)]
    if (blocks := found.blocks) is not None:
        numbers["gpu_blocks"] = blocks.count
        numbers["block_size"] = blocks.size
        evidence.append(bundle.evidence(blocks.hit))
    sizes = ""
    if per_token is not None:
        numbers["kv_bytes_per_token"] = per_token
        numbers["kv_capacity_gib"] = round(have * per_token / GiB, 2)
        numbers["kv_needed_gib_for_max_len"] = round(need * per_token / GiB, 2)
        sizes = (
            f" ({have * per_token / GiB:.2f} GiB at {per_token} bytes = "
            f"{per_token / 2**20:g} MiB/token), but max_model_len {need} needs "
            f"{need * per_token / GiB:.1f} GiB"
        )
    numbers["suggested_max_model_len"] = found.suggested
    if blocks is not None:
        sizes = f" in {blocks.count:g} GPU blocks of {blocks.size:g}" + sizes
    return Diagnosis(
        category="gpu-oom-kv-cache",
        summary=(
            f"KV cache too small for the context length (TP {bundle.tp()}): room for {have} "
            f"tokens{sizes}"
            + ("" if "needs" in sizes else f" but max_model_len is {need}")
            + f"; --max-model-len {found.suggested} fits"
        ),
        remedy=(
            f"decrease max_model_len (--max-model-len {found.suggested}), or increase "
            "--gpu-memory-utilization, use more GPUs (tensor parallel) or an fp8 kv cache"
        ),
        evidence=evidence,
        numbers=numbers,
    )


# vLLM V1 (v1/core/kv_cache_utils.py, check_enough_kv_cache_memory): one request of the maximum
# length needs more KV than the memory left after the weights and the profiled activations.
# Sizes are GiB; the estimate of the longest length that fits came later.
KV_NEEDED_V1 = re.compile(
    r"max seq len \((?P<need>\d+)\), \((?P<needed>[\d.]+) GiB KV cache is needed, which is "
    r"larger than the available KV cache memory \((?P<avail>-?[\d.]+) GiB\)"
    r"(?:.*?estimated maximum model length is (?P<est>\d+))?"
)


def kv_needed_v1(bundle: Bundle) -> Diagnosis | None:
    """vLLM V1: the KV one full-length request needs is more than the KV memory available."""
    hit = bundle.log.first(KV_NEEDED_V1)
    if hit is None:
        return None
    need, needed, avail = int(hit[1]["need"]), _num(hit[1]["needed"]), _num(hit[1]["avail"])
    est = int(hit[1]["est"]) if hit[1]["est"] else None
    util = bundle.engine_number("gpu_memory_utilization") or VLLM_DEFAULT_UTILIZATION
    numbers: dict[str, float] = {
        "max_model_len": need,
        "kv_needed_gib": needed,
        "kv_available_gib": avail,
        "gpu_memory_utilization": util,
    }
    longest = ""
    if est is not None:
        numbers["estimated_max_model_len"] = est
        numbers["suggested_max_model_len"] = est
        longest = f"; vLLM estimates the longest length that fits at {est} tokens"
    return Diagnosis(
        category="gpu-oom-kv-cache",
        summary=(
            f"KV cache too small for max_model_len {need}: one request of that length needs "
            f"{_fmt(needed)} GiB of KV, only {_fmt(avail)} GiB is available after the weights "
            f"and activations at --gpu-memory-utilization {_fmt(util)}{longest}"
        ),
        remedy=(
            "lower --max-model-len"
            + (f" to at most {est}" if est else "")
            + " (decrease max_model_len), or increase --gpu-memory-utilization, or store KV in "
            "--kv-cache-dtype fp8, or spread the model over more GPUs"
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


# vLLM (V0 and V1): the memory left for KV after the weights and the profiled peak is zero or
# less. V1 prints the figure first ("Available KV cache memory: -2.14 GiB").
NO_CACHE_BLOCKS = re.compile(r"No available memory for the cache blocks")
KV_AVAILABLE = re.compile(r"Available KV cache memory: (?P<avail>-?[\d.]+) GiB")
WEIGHTS_TOOK = re.compile(r"(?:Model loading took|model weights take) (?P<gib>[\d.]+) ?GiB")
USABLE_NOTE = re.compile(r"(?P<total>[\d.]+) GiB (?:usable|total)")


def no_cache_blocks(bundle: Bundle) -> Diagnosis | None:
    """vLLM: no memory for the KV cache blocks under --gpu-memory-utilization: the budget
    (utilization × the card) minus the weights and the profiled non-weight memory is ≤ 0."""
    hit = bundle.log.first(NO_CACHE_BLOCKS)
    if hit is None:
        return None
    util = bundle.engine_number("gpu_memory_utilization") or VLLM_DEFAULT_UTILIZATION
    numbers: dict[str, float] = {"gpu_memory_utilization": util}
    evidence = [bundle.evidence(hit)]
    said = [f"--gpu-memory-utilization {_fmt(util)}"]
    total = _card_gib(bundle)
    budget = round(util * total, 2) if total else None
    if budget is not None and total is not None:
        numbers["vllm_budget_gib"] = budget
        said[0] += f" gives vLLM {_fmt(util)} x {total:.2f} = {budget:.2f} GiB"
    weights = bundle.log.first(WEIGHTS_TOOK)
    if weights is not None:
        numbers["weights_gib"] = round(_num(weights[1]["gib"]), 2)
        said.append(f"the weights take {numbers['weights_gib']:.2f} GiB")
        evidence.append(bundle.evidence(weights))
    kv = bundle.log.first(KV_AVAILABLE)
    if kv is not None:
        numbers["available_kv_gib"] = _num(kv[1]["avail"])
        evidence.append(bundle.evidence(kv))
        if budget is not None and weights is not None:
            other = round(budget - numbers["weights_gib"] - numbers["available_kv_gib"], 2)
            numbers["non_weight_usage_gib"] = other
            said.append(f"activations and non-torch memory about {other:.2f} GiB")
        said.append(f"leaving {_fmt(numbers['available_kv_gib'])} GiB for the KV cache")
    # The utilization at which the KV cache gets room: the shortfall over the card, plus 0.01.
    suggested = None
    if total and "available_kv_gib" in numbers:
        needed = math.ceil((util - numbers["available_kv_gib"] / total + 0.01) * 100) / 100
        suggested = needed if needed <= 0.95 else None
    if suggested is not None:
        numbers["suggested_gpu_memory_utilization"] = suggested
    return Diagnosis(
        category="mem-fraction-too-low",
        summary="no memory for vLLM's KV cache: " + ", ".join(said),
        remedy=(
            (
                f"increase --gpu-memory-utilization (to {suggested:.2f}) if the card is otherwise "
                "idle, "
                if suggested is not None
                else "no --gpu-memory-utilization makes room: "
            )
            + "lower the activation peak (--max-num-batched-tokens 1024, lower "
            "--max-model-len), or spread the weights over more GPUs (--tensor-parallel-size 2)"
        ),
        evidence=evidence,
        numbers=numbers,
    )


def _card_gib(bundle: Bundle) -> float | None:
    """The card's size as CUDA reports it (a note), else the node's first GPU, GiB."""
    note = bundle.note_match(USABLE_NOTE)
    if note is not None:
        return _num(note["total"])
    for gpu in (bundle.facts.get("node") or {}).get("gpus") or []:
        total = gpu.get("memory_total_bytes")
        if isinstance(total, int | float) and total > 0:
            return round(total / GiB, 2)
    return None


#: The line that alone shows each rule's failure, whatever its figures say (engine._unreadable).
RECOGNISES: dict[Rule, tuple[str, re.Pattern[str]]] = {
    kv_cache_too_small: ("gpu-oom-kv-cache", re.compile(r"stored in KV cache \(")),
    kv_needed_v1: ("gpu-oom-kv-cache", re.compile(r"KV cache is needed, which is larger than")),
    no_cache_blocks: ("mem-fraction-too-low", NO_CACHE_BLOCKS),
    vllm_gpu_occupied: (
        "gpu-occupied-by-other-process",
        re.compile(r"on startup is less than desired GPU memory"),
    ),
}
