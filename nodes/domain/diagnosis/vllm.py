"""Rules for failures only vLLM reports: the GPU's free memory below --gpu-memory-utilization, a
KV cache too small for --max-model-len."""

from __future__ import annotations

import math
import re

from nodes.domain.diagnosis.evidence import Bundle, Diagnosis, GiB, _fmt, _num
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
    return Diagnosis(
        category="gpu-occupied-by-other-process",
        secondary_categories=["mem-fraction-too-high"],
        summary=(
            f"GPU already partly occupied: {others:.2f} GiB held by another process, so "
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
        },
    )


KV_TOO_SMALL = re.compile(
    r"max seq len \((?P<need>\d+)\) is larger than the maximum number of tokens that can be "
    r"stored in KV cache \((?P<have>\d+)\)"
)


GPU_BLOCKS = re.compile(r"# GPU blocks: (?P<blocks>\d+)")


def kv_cache_too_small(bundle: Bundle) -> Diagnosis | None:
    """vLLM: the KV cache holds fewer tokens than one request of the maximum length needs."""
    hit = bundle.log.first(KV_TOO_SMALL)
    if hit is None:
        return None
    need, have = int(hit[1]["need"]), int(hit[1]["have"])
    numbers: dict[str, float] = {"max_model_len": need, "kv_capacity_tokens": have}
    evidence = [bundle.evidence(hit)]
    blocks = bundle.log.first(GPU_BLOCKS)
    if blocks is not None:
        numbers["gpu_blocks"] = int(blocks[1]["blocks"])
        numbers["block_size"] = have // max(1, int(blocks[1]["blocks"]))
        evidence.append(bundle.evidence(blocks))
    sizes = ""
    config = bundle.facts.get("model_config")
    if isinstance(config, dict):
        try:
            geometry = from_config(config)
        except GeometryError:
            geometry = None
        if geometry is not None:
            per_token = kv_bytes_per_token(
                geometry, 1, 1, kv_elem_bytes("auto", geometry.torch_dtype)
            )
            numbers["kv_bytes_per_token"] = per_token
            numbers["kv_capacity_gib"] = round(have * per_token / GiB, 2)
            numbers["kv_needed_gib_for_max_len"] = round(need * per_token / GiB, 2)
            sizes = (
                f" ({have * per_token / GiB:.2f} GiB at {per_token} bytes = "
                f"{per_token / 2**20:g} MiB/token), but max_model_len {need} needs "
                f"{need * per_token / GiB:.1f} GiB"
            )
    # A little below the capacity (2 %), in round hundreds: one full-length request must fit.
    suggested = int(round(have * 0.98, -2))
    numbers["suggested_max_model_len"] = suggested
    if "gpu_blocks" in numbers:
        sizes = f" in {numbers['gpu_blocks']:g} GPU blocks of {numbers['block_size']:g}" + sizes
    return Diagnosis(
        category="gpu-oom-kv-cache",
        summary=(
            f"KV cache too small for the context length: room for {have} tokens{sizes}"
            + ("" if "needs" in sizes else f" but max_model_len is {need}")
            + f"; --max-model-len {suggested} fits"
        ),
        remedy=(
            f"decrease max_model_len (--max-model-len {suggested}), or increase "
            "--gpu-memory-utilization, use more GPUs (tensor parallel) or an fp8 kv cache"
        ),
        evidence=evidence,
        numbers=numbers,
    )
