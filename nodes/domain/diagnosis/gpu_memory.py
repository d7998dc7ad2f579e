"""Rules for GPU memory that --mem-fraction-static splits wrongly: no room left for the KV cache,
an OOM while capturing CUDA graphs, no fraction that works at all."""

from __future__ import annotations

import math
import re

from nodes.domain.diagnosis.evidence import LOAD_BEGIN, LOAD_END, Bundle, Diagnosis, GiB, _fmt, _num
from nodes.domain.diagnosis.pytorch_oom import OOM_BEFORE_2_1, oom_figures

NOT_ENOUGH_KV = re.compile(
    r"Not enough memory\. Please try to increase --mem-fraction-static|Loaded weights leave no "
    r"GPU memory for the KV cache"
)


def mem_fraction_too_low(bundle: Bundle) -> Diagnosis | None:
    """Weights leave no KV space: mem-fraction-static keeps (1 − mfs) × the free memory before
    the weights for activations, and what is left after the weights is less (§3)."""
    hit = bundle.log.first(NOT_ENOUGH_KV)
    begin, end = bundle.log.first(LOAD_BEGIN), bundle.log.first(LOAD_END)
    mfs = bundle.number("mem_fraction_static")
    if hit is None or begin is None or end is None or mfs is None:
        return None
    before, after, weights = (
        _num(begin[1]["avail"]),
        _num(end[1]["avail"]),
        _num(end[1]["used"]),
    )
    mfs = float(mfs)
    reserved = before * (1 - mfs)
    kv = after - reserved
    threshold = math.ceil((1 - after / before) * 1000) / 1000
    gpus = (bundle.facts.get("node") or {}).get("gpus") or []
    numbers = {
        "avail_before_load_gib": before,
        "weights_gib": weights,
        "avail_after_load_gib": after,
        "mem_fraction_static": mfs,
        "reserved_gib": round(reserved, 2),
        "kv_budget_gib": round(kv, 2),
        "mem_fraction_static_threshold": threshold,
        "suggested_mem_fraction_static": min(math.floor(threshold * 100) / 100 + 0.01, 0.95),
    }
    total = ""
    if gpus and gpus[0].get("memory_total_bytes"):
        numbers["gpu_total_gib"] = round(gpus[0]["memory_total_bytes"] / GiB, 1)
        total = f" on a {_fmt(numbers['gpu_total_gib'], 1)} GiB GPU"
    return Diagnosis(
        category="mem-fraction-too-low",
        summary=(
            f"KV cache cannot be allocated{total}: after {weights:.2f} GiB of weights only "
            f"{after:.2f} GiB is free, but --mem-fraction-static {_fmt(mfs)} keeps "
            f"{before:.2f} x {_fmt(1 - mfs)} = {reserved:.2f} GiB of the pre-load free memory "
            f"for activations/graphs, leaving {kv:.2f} GiB for KV; this needs a higher fraction "
            f"(above {threshold}) or more GPUs"
        ),
        remedy=(
            f"increase --mem-fraction-static above {threshold} (reserved = free-before-load x "
            "(1 - mem_fraction_static)), or spread the weights over more GPUs (--tp 2); this is "
            "an init OOM, not a runtime one (init OOM vs runtime OOM)"
        ),
        evidence=[bundle.evidence(hit), bundle.evidence(begin), bundle.evidence(end)],
        numbers=numbers,
    )


GRAPH_OOM = re.compile(
    r"Capture (?:prefill )?(?:cuda|CUDA) graph failed: .*?Tried to allocate "
    r"(?P<tried>[\d.]+) GiB\. GPU (?P<gpu>\d+) has a total capacity of (?P<total>[\d.]+) GiB of "
    r"which (?P<free>[\d.]+) "
    r"GiB is free"
)


GRAPH_OOM_BEFORE_2_1 = re.compile(
    r"Capture (?:prefill )?(?:cuda|CUDA) graph failed: .*?" + OOM_BEFORE_2_1.pattern
)


CAPTURE_BS = re.compile(r"Capturing batches \(bs=(?P<bs>\d+)")


BS_NOTE = re.compile(
    r"(?i)(?:capture batch size|cuda-graph-max-bs)[^.]*?from (?P<before>\d+) to (?P<after>\d+)"
)


def gpu_oom_cuda_graph(bundle: Bundle) -> Diagnosis | None:
    """Out of GPU memory while capturing CUDA graphs: what mem-fraction-static left outside the
    static pool (activations, graphs) was too little (§3, §6). With no fraction on the command
    line the value in ``server_args`` is SGLang's automatic one (§1c)."""
    hit = bundle.log.first(GRAPH_OOM)
    if hit is not None:
        tried, total, free = (_num(hit[1][k]) for k in ("tried", "total", "free"))
    elif (hit := bundle.log.first(GRAPH_OOM_BEFORE_2_1)) is not None:
        figures = oom_figures(hit[1])
        tried, total, free = figures["tried"], figures["total"], figures["free"]
    else:
        return None
    gpu = int(hit[1]["gpu"])
    mfs = bundle.number("mem_fraction_static")
    auto = bundle.flag("mem_fraction_static") is None and not bundle.given("--mem-fraction-static")
    tp = bundle.tp()
    numbers: dict[str, float] = {
        "tried_to_allocate_gib": tried,
        "free_gib_at_oom": free,
        "gpu_total_gib": total,
        "failing_gpu": gpu,
        "tp_size": tp,
    }
    label = bundle.gpu_label()
    on = f" ({label}, TP {tp})" if label else f" (TP {tp})"
    keeps = ""
    begin = bundle.log.first(LOAD_BEGIN)
    if mfs is not None:
        numbers["mem_fraction_static_failing"] = mfs
        keeps = f"; {'the automatic ' if auto else ''}--mem-fraction-static {_fmt(mfs, 3)} "
        if begin is not None:
            before = _num(begin[1]["avail"])
            reserved = round((1 - mfs) * before, 2)
            numbers.update(reserved_gib_for_graphs=reserved)
            keeps += f"keeps only {_fmt(1 - mfs, 3)} x {before:.2f} = {reserved:.2f} GiB"
            if auto:
                numbers["reserve_gib_of_total"] = round((1 - mfs) * total, 2)
                keeps += f" (of the whole card {_fmt(1 - mfs, 3)} x {total:.2f} = "
                keeps += f"{(1 - mfs) * total:.2f} GiB)"
            keeps += " for graphs and activations"
    graph = ""
    max_bs = bundle.setting("cuda_graph_max_bs")
    captured = bundle.log.find(CAPTURE_BS)
    if not isinstance(max_bs, int) and captured:
        max_bs = max(int(m["bs"]) for _, m in captured)
    lower_bs = max_bs // 2 if isinstance(max_bs, int) else None
    if isinstance(max_bs, int):
        numbers["cuda_graph_max_bs"] = max_bs
        graph = f"; capture goes up to bs {max_bs}"
        note = bundle.note_match(BS_NOTE)
        if note is not None and int(note["after"]) == max_bs:
            lower_bs = int(note["before"])
            numbers["cuda_graph_max_bs_before"] = lower_bs
            graph += f" (raised from {lower_bs} by this version's default)"
    extra = ""
    if bundle.flag("enable_hierarchical_cache") is True:
        ratio, page = bundle.number("hicache_ratio") or 2.0, bundle.count("page_size")
        numbers.update(hicache_ratio=ratio, page_size=page)
        extra = (
            f"; HiCache (hicache_ratio {_fmt(ratio)}, page_size {page}) adds transfer "
            "buffers on top"
        )
    # Roughly 0.03-0.05 more of the card per step is what a capture OOM usually needs.
    lower = f" to {mfs - 0.04:.2f}" if mfs is not None and mfs > 0.5 else ""
    if mfs is not None and lower:
        numbers["suggested_mem_fraction_static"] = round(mfs - 0.04, 2)
    if lower_bs:
        numbers["suggested_cuda_graph_max_bs"] = lower_bs
    return Diagnosis(
        category="gpu-oom-cuda-graph",
        secondary_categories=["mem-fraction-too-high"],
        summary=(
            f"GPU OOM during CUDA-graph capture on GPU {gpu}{on}: tried to allocate {tried:.2f} "
            f"GiB, {free:.2f} GiB of {_fmt(total)} GiB free{keeps}{graph}{extra}"
        ),
        remedy=(
            f"lower --mem-fraction-static{lower}"
            + (" (re-tune the mem fraction when enabling HiCache)" if extra else "")
            + ", or cap graph capture with --cuda-graph-max-bs"
            + (f" {lower_bs}" if lower_bs else "")
            + (
                "; a larger --page-size shrinks the hicache transfer buffers"
                if extra
                else "; upgrade if a newer version reserves more for graphs on this GPU"
            )
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


CUDA_OOM = re.compile(r"(?:torch\.)?(?:cuda\.)?OutOfMemoryError: CUDA out of memory")


ATTEMPT_MFS = re.compile(r"server_args=ServerArgs\(.*?mem_fraction_static=(?P<mfs>[\d.]+)")


TOTAL_CAPACITY = re.compile(r"GPU \d+ has a total capacity of (?P<total>[\d.]+) GiB")


MFS_NOTE = re.compile(
    r"(?i)out of memory[^.]*?--mem-fraction-static\s*(?:>=|≥)\s*(?P<mfs>\d*\.\d+|\d+)"
)


def mem_fraction_window(bundle: Bundle) -> Diagnosis | None:
    """Attempts at two fractions where the higher ran out of GPU memory and the lower left no
    KV cache: no value of mem-fraction-static works for this configuration (§3: the fraction
    splits the free memory before load between the static pools and everything else)."""
    oom, low = bundle.log.first(CUDA_OOM), bundle.log.first(NOT_ENOUGH_KV)
    attempts = [_num(m["mfs"]) for _, m in bundle.log.find(ATTEMPT_MFS)]
    if oom is None or low is None or len(set(attempts)) < 2:
        return None
    high, lower = max(attempts), min(attempts)
    numbers: dict[str, float] = {"mfs_oom": high, "mfs_not_enough_memory": lower}
    card = ""
    label = bundle.gpu_label()
    capacity = bundle.log.first(TOTAL_CAPACITY)
    if capacity is not None:
        numbers["gpu_total_gib"] = _num(capacity[1]["total"])
    else:
        gpus = (bundle.facts.get("node") or {}).get("gpus") or []
        total = (gpus[0] or {}).get("memory_total_bytes") if gpus else None
        if isinstance(total, int | float) and total > 0:
            numbers["gpu_total_gib"] = round(total / GiB, 2)
    begin = bundle.log.first(LOAD_BEGIN)
    if begin is not None:
        numbers["avail_before_load_gib"] = _num(begin[1]["avail"])
    if label or "gpu_total_gib" in numbers:
        card = f" on {label or 'a GPU'}"
        if "gpu_total_gib" in numbers:
            card += f" ({numbers['gpu_total_gib']:.2f} GiB"
            if begin is not None:
                card += f", {numbers['avail_before_load_gib']:.2f} GiB free before the weights"
            card += ")"
    speculative = ""
    if bundle.setting("speculative_algorithm"):
        speculative = (
            " (with speculative decoding the draft model's pool is sized from what the target "
            "model and its KV pool left)"
        )
    related = ""
    note = bundle.note_match(MFS_NOTE)
    if note is not None:
        numbers["noted_oom_at_mfs_ge"] = float(note["mfs"])
        related = (
            f"; the notes add a report that runs out of memory at every --mem-fraction-static "
            f">= {note['mfs']}"
        )
    return Diagnosis(
        category="mem-fraction-window",
        secondary_categories=["gpu-oom-cuda-graph", "mem-fraction-too-low"],
        summary=(
            f"no workable --mem-fraction-static{card}: {_fmt(high)} runs out of GPU memory and "
            f"{_fmt(lower)} leaves no memory for the KV cache{speculative}{related}; shrink the "
            "demand instead of tuning the fraction"
        ),
        remedy=(
            "reduce --max-running-requests, --cuda-graph-max-bs or --context-length (with "
            "speculative decoding also --speculative-num-draft-tokens), or use more GPUs (--tp 2)"
        ),
        evidence=[bundle.evidence(oom), bundle.evidence(low)],
        numbers=numbers,
    )
