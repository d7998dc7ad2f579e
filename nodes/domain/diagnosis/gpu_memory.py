"""Rules for GPU memory that --mem-fraction-static splits wrongly: no room left for the KV cache,
an OOM while capturing CUDA graphs, no fraction that works at all."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from nodes.domain.diagnosis.evidence import (
    LOAD_BEGIN,
    LOAD_END,
    VLLM_DEFAULT_UTILIZATION,
    Bundle,
    Diagnosis,
    GiB,
    Hit,
    Rule,
    _fmt,
    _num,
)
from nodes.domain.diagnosis.pytorch_oom import (
    OOM_BEFORE_2_1,
    OOM_SINCE_2_1,
    gib_of,
)

NOT_ENOUGH_KV = re.compile(
    r"Not enough memory\. Please try to increase --mem-fraction-static|Loaded weights leave no "
    r"GPU memory for the KV cache"
)


@dataclass(frozen=True)
class NoKvRoom:
    """What the weights left, GiB (``Load weight begin/end``): free memory before and after them,
    their size; what the fraction keeps back (``reserved`` = before × (1 − mfs)), what is left
    for KV (``kv`` = after − reserved), the fraction above which KV gets room (``threshold``,
    rounded up to 0.001) and the card's size (one decimal) when the facts say."""

    hit: Hit
    begin: Hit
    end: Hit
    before: float
    after: float
    weights: float
    mfs: float
    reserved: float
    kv: float
    threshold: float
    gpu_total_gib: float | None

    @property
    def suggested(self) -> float | None:
        """The threshold rounded down to 0.01, plus 0.01; ``None`` above 0.95 (no fraction a
        server runs with leaves the KV cache room: more GPUs are the fix)."""
        value = math.floor(self.threshold * 100) / 100 + 0.01
        return value if value <= 0.95 else None


def _no_kv_room(bundle: Bundle) -> NoKvRoom | None:
    hit = bundle.log.first(NOT_ENOUGH_KV)
    begin, end = bundle.log.first(LOAD_BEGIN), bundle.log.first(LOAD_END)
    mfs = bundle.number("mem_fraction_static")
    if hit is None or begin is None or end is None or mfs is None:
        return None
    before, after = _num(begin[1]["avail"]), _num(end[1]["avail"])
    weights, mfs = _num(end[1]["used"]), float(mfs)
    reserved = before * (1 - mfs)
    gpus = (bundle.facts.get("node") or {}).get("gpus") or []
    total = None
    if gpus and gpus[0].get("memory_total_bytes"):
        total = round(gpus[0]["memory_total_bytes"] / GiB, 1)
    return NoKvRoom(
        hit,
        begin,
        end,
        before,
        after,
        weights,
        mfs,
        reserved,
        kv=after - reserved,
        threshold=math.ceil((1 - after / before) * 1000) / 1000,
        gpu_total_gib=total,
    )


def mem_fraction_too_low(bundle: Bundle) -> Diagnosis | None:
    """Weights leave no KV space: mem-fraction-static keeps (1 − mfs) × the free memory before
    the weights for activations, and what is left after the weights is less (§3)."""
    found = _no_kv_room(bundle)
    return None if found is None else _no_kv_room_diagnosis(bundle, found)


def _no_kv_room_diagnosis(bundle: Bundle, found: NoKvRoom) -> Diagnosis:
    numbers = {
        "avail_before_load_gib": found.before,
        "weights_gib": found.weights,
        "avail_after_load_gib": found.after,
        "mem_fraction_static": found.mfs,
        "reserved_gib": round(found.reserved, 2),
        "kv_budget_gib": round(found.kv, 2),
        "mem_fraction_static_threshold": found.threshold,
    }
    if found.suggested is not None:
        numbers["suggested_mem_fraction_static"] = found.suggested
    total = ""
    if found.gpu_total_gib is not None:
        numbers["gpu_total_gib"] = found.gpu_total_gib
        total = f" on a {_fmt(found.gpu_total_gib, 1)} GiB GPU"
    if found.threshold >= 1:
        return Diagnosis(
            category="gpu-oom-weights",
            summary=(
                f"the weights do not fit{total}: {found.weights:.2f} GiB of weights leave "
                f"{found.after:.2f} GiB of the {found.before:.2f} GiB free before loading, so no "
                f"--mem-fraction-static leaves room for the KV cache (TP {bundle.tp()})"
            ),
            remedy=(
                "spread the weights over more GPUs (a larger --tp-size), or a quantized "
                "checkpoint (FP8/AWQ/GPTQ), or a GPU with more memory"
            ),
            evidence=[bundle.evidence(found.hit), bundle.evidence(found.end)],
            numbers=numbers,
        )
    return Diagnosis(
        category="mem-fraction-too-low",
        summary=(
            f"KV cache cannot be allocated{total}: after {found.weights:.2f} GiB of weights only "
            f"{found.after:.2f} GiB is free, but --mem-fraction-static {_fmt(found.mfs)} keeps "
            f"{found.before:.2f} x {_fmt(1 - found.mfs)} = {found.reserved:.2f} GiB of the "
            f"pre-load free memory for activations/graphs, leaving {found.kv:.2f} GiB for KV; "
            f"this needs a higher fraction (above {found.threshold}) or more GPUs"
        ),
        remedy=(
            f"increase --mem-fraction-static above {found.threshold} (reserved = free-before-load "
            "x (1 - mem_fraction_static)), or spread the weights over more GPUs (--tp 2); this is "
            "an init OOM, not a runtime one (init OOM vs runtime OOM)"
        ),
        evidence=[
            bundle.evidence(found.hit),
            bundle.evidence(found.begin),
            bundle.evidence(found.end),
        ],
        numbers=numbers,
    )


# PyTorch's OOM text in any of format_size's units, on CUDA or ROCm (HIP prints the same
# allocator text); SGLang wraps it in "Capture cuda graph failed: …" when capture raises.
GRAPH_OOM = re.compile(
    rf"Capture (?:prefill )?(?:cuda|CUDA) graph failed: .*?{OOM_SINCE_2_1.pattern}"
)


GRAPH_OOM_BEFORE_2_1 = re.compile(
    r"Capture (?:prefill )?(?:cuda|CUDA) graph failed: .*?" + OOM_BEFORE_2_1.pattern
)


# Where a log is capturing graphs: SGLang's "Capture cuda graph begin" and its per-batch
# progress, vLLM's "Capturing cudagraphs"/"Capturing CUDA graphs" and the frames of a traceback
# raised inside capture. An OOM after one of them (and before the server is ready) is a capture
# OOM whatever line raised it.
CAPTURE_MARK = re.compile(
    r"Capture (?:prefill )?(?:cuda|CUDA) graph begin|Capturing batches \(bs=|"
    r"Capturing (?:cudagraphs|CUDA graphs?|CUDA graph shapes)|in capture_model|"
    r"cuda_graph_runner\.py\S*, line \d+, in capture|in capture_one_batch_size"
)
CAPTURE_BEGIN_AVAIL = re.compile(
    r"Capture (?:prefill )?(?:cuda|CUDA) graph begin\..*?avail mem=(?P<avail>[\d.]+ GB)"
)
READY_MARK = re.compile(r"The server is fired up|Application startup complete")


CAPTURE_BS = re.compile(r"Capturing batches \(bs=(?P<bs>\d+)")


BS_NOTE = re.compile(
    r"(?i)(?:capture batch size|cuda-graph-max-bs)[^.]*?from (?P<before>\d+) to (?P<after>\d+)"
)


@dataclass(frozen=True)
class GraphOom:
    """An OOM while capturing CUDA graphs on GPU ``gpu``: its sizes in GiB; the fraction
    (``auto``: SGLang chose it) and the free memory before the weights (GiB, read only with a
    fraction); the capture's largest batch size and the smaller one this version's default
    raised it from (``raised_from``); HiCache's ratio and page size when it is on."""

    hit: Hit
    gpu: int
    tried: float
    total: float
    free: float
    printed: dict[str, str]
    tp: int
    label: str | None
    mfs: float | None
    auto: bool
    before: float | None
    max_bs: int | None
    raised_from: int | None
    hicache: tuple[float, int] | None
    capture_avail: str | None = None
    util: float | None = None

    @property
    def outside_budget(self) -> float | None:
        """vLLM: GiB its --gpu-memory-utilization leaves outside its budget, (1 − util) × total."""
        return None if self.util is None else round((1 - self.util) * self.total, 2)

    @property
    def lower_util(self) -> float | None:
        """vLLM: the utilization to suggest, 0.05 lower (at most 0.9)."""
        return None if self.util is None else round(min(self.util - 0.05, 0.9), 2)

    @property
    def reserved(self) -> float | None:
        """GiB the fraction keeps outside the static pool: (1 − mfs) × free before the weights."""
        if self.mfs is None or self.before is None:
            return None
        return round((1 - self.mfs) * self.before, 2)

    @property
    def lower_mfs(self) -> float | None:
        """The fraction to suggest: 0.04 lower, for fractions above 0.5 only."""
        # Roughly 0.03-0.05 more of the card per step is what a capture OOM usually needs.
        return self.mfs - 0.04 if self.mfs is not None and self.mfs > 0.5 else None

    @property
    def lower_bs(self) -> int | None:
        """The batch size to cap capture at: the one before the raise, else half the largest."""
        if self.raised_from is not None:
            return self.raised_from
        return self.max_bs // 2 if self.max_bs is not None else None


def _graph_oom_sizes(bundle: Bundle) -> tuple[Hit, dict[str, str]] | None:
    """The capture OOM's line and its tried, total and free sizes as printed (``"212.00 MiB"``),
    in either PyTorch text: the OOM SGLang reports as a failed capture, else the first OOM
    raised while capturing (after a ``CAPTURE_MARK``, before the server was ready)."""
    hit = (
        bundle.log.first(GRAPH_OOM)
        or bundle.log.first(GRAPH_OOM_BEFORE_2_1)
        or _oom_while_capturing(bundle)
    )
    if hit is None:
        return None
    return hit, {k: hit[1][k] for k in ("tried", "total", "free")}


def _oom_while_capturing(bundle: Bundle) -> Hit | None:
    marks = [n for n, _ in bundle.log.find(CAPTURE_MARK)]
    if not marks:
        return None
    ready = [n for n, _ in bundle.log.find(READY_MARK)]
    for hit in sorted([*bundle.log.find(OOM_SINCE_2_1), *bundle.log.find(OOM_BEFORE_2_1)]):
        began = [n for n in marks if n <= hit[0]]
        # A traceback's frames print after the line they lead to: a mark close after the OOM
        # (the same traceback) counts too.
        after = [n for n in marks if hit[0] < n <= hit[0] + 40]
        if (began and not any(began[-1] < r < hit[0] for r in ready)) or (after and not began):
            return hit
    return None


def _capture_bs(bundle: Bundle) -> tuple[int | None, int | None]:
    """(the capture's largest batch size, the size this version's default raised it from)."""
    max_bs = bundle.setting("cuda_graph_max_bs")
    captured = bundle.log.find(CAPTURE_BS)
    if not isinstance(max_bs, int) and captured:
        max_bs = max(int(m["bs"]) for _, m in captured)
    if not isinstance(max_bs, int):
        return None, None
    note = bundle.note_match(BS_NOTE)
    if note is not None and int(note["after"]) == max_bs:
        return max_bs, int(note["before"])
    return max_bs, None


def _graph_oom(bundle: Bundle) -> GraphOom | None:
    sizes = _graph_oom_sizes(bundle)
    if sizes is None:
        return None
    hit, printed = sizes
    tried, total, free = (gib_of(printed[k]) for k in ("tried", "total", "free"))
    mfs = bundle.number("mem_fraction_static")
    auto = bundle.flag("mem_fraction_static") is None and not bundle.given("--mem-fraction-static")
    begin = bundle.log.first(LOAD_BEGIN)
    before = _num(begin[1]["avail"]) if mfs is not None and begin is not None else None
    max_bs, raised_from = _capture_bs(bundle)
    hicache = None
    if bundle.flag("enable_hierarchical_cache") is True:
        hicache = (bundle.number("hicache_ratio") or 2.0, bundle.count("page_size"))
    begun = bundle.log.first(CAPTURE_BEGIN_AVAIL)
    util = None
    if bundle.vllm:
        util = bundle.engine_number("gpu_memory_utilization") or VLLM_DEFAULT_UTILIZATION
    return GraphOom(
        hit,
        int(hit[1]["gpu"]),
        tried,
        total,
        free,
        printed,
        bundle.tp(),
        bundle.gpu_label(),
        mfs,
        auto,
        before,
        max_bs,
        raised_from,
        hicache,
        capture_avail=begun[1]["avail"] if begun else None,
        util=util,
    )


def gpu_oom_cuda_graph(bundle: Bundle) -> Diagnosis | None:
    """Out of GPU memory while capturing CUDA graphs: what mem-fraction-static left outside the
    static pool (activations, graphs) was too little (§3, §6). With no fraction on the command
    line the value in ``server_args`` is SGLang's automatic one (§1c)."""
    found = _graph_oom(bundle)
    return None if found is None else _graph_oom_diagnosis(bundle, found)


def _graph_oom_diagnosis(bundle: Bundle, found: GraphOom) -> Diagnosis:
    on = f" ({found.label}, TP {found.tp})" if found.label else f" (TP {found.tp})"
    return Diagnosis(
        category="gpu-oom-cuda-graph",
        secondary_categories=["mem-fraction-too-high"],
        summary=(
            f"GPU OOM during CUDA-graph capture on {bundle.gpu_named(found.gpu)}{on}: tried to "
            "allocate "
            f"{found.printed['tried']}, {found.printed['free']} of {found.printed['total']} free"
            f"{_graph_oom_began(found)}{_graph_oom_keeps(found)}{_graph_oom_capture(found)}"
            f"{_graph_oom_hicache(found)}"
        ),
        remedy=_graph_oom_remedy(found),
        evidence=[bundle.evidence(found.hit)],
        numbers=_graph_oom_numbers(found),
    )


def _graph_oom_numbers(found: GraphOom) -> dict[str, float]:
    numbers: dict[str, float] = {
        "tried_to_allocate_gib": found.tried,
        "free_gib_at_oom": found.free,
        "gpu_total_gib": found.total,
        "failing_gpu": found.gpu,
        "tp_size": found.tp,
    }
    if found.mfs is not None:
        numbers["mem_fraction_static_failing"] = found.mfs
        if found.reserved is not None:
            numbers["reserved_gib_for_graphs"] = found.reserved
            if found.auto:
                numbers["reserve_gib_of_total"] = round((1 - found.mfs) * found.total, 2)
    if found.max_bs is not None:
        numbers["cuda_graph_max_bs"] = found.max_bs
        if found.raised_from is not None:
            numbers["cuda_graph_max_bs_before"] = found.raised_from
    if found.hicache is not None:
        numbers.update(hicache_ratio=found.hicache[0], page_size=found.hicache[1])
    if found.lower_mfs is not None:
        numbers["suggested_mem_fraction_static"] = round(found.lower_mfs, 2)
    if found.lower_bs:
        numbers["suggested_cuda_graph_max_bs"] = found.lower_bs
    if found.util is not None:
        numbers["gpu_memory_utilization"] = found.util
        if found.outside_budget is not None:
            numbers["outside_budget_gib"] = found.outside_budget
        if found.lower_util is not None:
            numbers["suggested_gpu_memory_utilization"] = found.lower_util
    return numbers


def _graph_oom_keeps(found: GraphOom) -> str:
    """What the fraction keeps for graphs and activations; empty without a fraction."""
    if found.mfs is None:
        return ""
    mfs, auto = found.mfs, found.auto
    keeps = f"; {'the automatic ' if auto else ''}--mem-fraction-static {_fmt(mfs, 3)} "
    if found.before is None or found.reserved is None:
        return keeps
    keeps += f"keeps only {_fmt(1 - mfs, 3)} x {found.before:.2f} = {found.reserved:.2f} GiB"
    if auto:
        keeps += f" (of the whole card {_fmt(1 - mfs, 3)} x {found.total:.2f} = "
        keeps += f"{(1 - mfs) * found.total:.2f} GiB)"
    return keeps + " for graphs and activations"


def _graph_oom_began(found: GraphOom) -> str:
    """When capture began with (SGLang's avail mem=, GiB though it prints GB), and for vLLM
    what its utilization left outside its budget."""
    said = ""
    if found.capture_avail:
        # SGLang's "avail mem=1.38 GB" is GiB (it divides by 1 << 30).
        gib = found.capture_avail.removesuffix(" GB")
        said = f"; capture began with {gib} GiB free (SGLang's avail mem=, printed as GB)"
    if found.util is not None and found.outside_budget is not None:
        said += (
            f"; --gpu-memory-utilization {_fmt(found.util)} leaves (1 - {_fmt(found.util)}) x "
            f"{found.total:.2f} GiB = {found.outside_budget:.2f} GiB outside vLLM's budget for "
            "the graphs"
        )
    return said


def _graph_oom_capture(found: GraphOom) -> str:
    if found.max_bs is None:
        return ""
    graph = f"; capture goes up to bs {found.max_bs}"
    if found.raised_from is not None:
        graph += f" (raised from {found.raised_from} by this version's default)"
    return graph


def _graph_oom_hicache(found: GraphOom) -> str:
    if found.hicache is None:
        return ""
    ratio, page = found.hicache
    return f"; HiCache (hicache_ratio {_fmt(ratio)}, page_size {page}) adds transfer buffers on top"


def _graph_oom_remedy(found: GraphOom) -> str:
    if found.util is not None:
        return (
            f"lower --gpu-memory-utilization (to {found.lower_util:.2f}), capture fewer/smaller "
            "graphs (reduce --max-num-seqs, fewer cudagraph capture sizes), or run without "
            "graphs (--enforce-eager)"
        )
    hicache = found.hicache is not None
    return (
        "lower --mem-fraction-static"
        + (f" to {found.lower_mfs:.2f}" if found.lower_mfs is not None else "")
        + (" (re-tune the mem fraction when enabling HiCache)" if hicache else "")
        + ", or cap graph capture with --cuda-graph-max-bs"
        + (f" {found.lower_bs}" if found.lower_bs else "")
        + (
            "; a larger --page-size shrinks the hicache transfer buffers"
            if hicache
            else "; upgrade if a newer version reserves more for graphs on this GPU"
        )
    )


CUDA_OOM = re.compile(r"(?:torch\.)?(?:cuda\.)?OutOfMemoryError: (?:CUDA|HIP) out of memory")


ATTEMPT_MFS = re.compile(r"server_args=ServerArgs\(.*?mem_fraction_static=(?P<mfs>[\d.]+)")


TOTAL_CAPACITY = re.compile(r"GPU \d+ has a total capaci?ty of (?P<total>[\d.]+) GiB")


MFS_NOTE = re.compile(
    r"(?i)out of memory[^.]*?--mem-fraction-static\s*(?:>=|≥)\s*(?P<mfs>\d*\.\d+|\d+)"
)


@dataclass(frozen=True)
class FractionWindow:
    """Two attempts at ``high`` and ``lower`` mem-fraction-static, the first out of GPU memory
    (``oom``), the second without room for KV (``low``); the card (``label``, its size in GiB,
    the free memory before the weights), whether speculative decoding ran, and the fraction a
    snapshot note says fails at and above (as the note writes it)."""

    oom: Hit
    low: Hit
    high: float
    lower: float
    label: str | None
    gpu_total_gib: float | None
    before: float | None
    speculative: bool
    noted_mfs: str | None


def _card_size(bundle: Bundle) -> float | None:
    """GiB of the card: PyTorch's ``total capacity`` in the log, else the node's first GPU."""
    capacity = bundle.log.first(TOTAL_CAPACITY)
    if capacity is not None:
        return _num(capacity[1]["total"])
    gpus = (bundle.facts.get("node") or {}).get("gpus") or []
    total = (gpus[0] or {}).get("memory_total_bytes") if gpus else None
    return round(total / GiB, 2) if isinstance(total, int | float) and total > 0 else None


def _fraction_window(bundle: Bundle) -> FractionWindow | None:
    oom, low = bundle.log.first(CUDA_OOM), bundle.log.first(NOT_ENOUGH_KV)
    attempts = [_num(m["mfs"]) for _, m in bundle.log.find(ATTEMPT_MFS)]
    if oom is None or low is None or len(set(attempts)) < 2:
        return None
    label = bundle.gpu_label()
    total = _card_size(bundle)
    begin = bundle.log.first(LOAD_BEGIN)
    note = bundle.note_match(MFS_NOTE)
    return FractionWindow(
        oom,
        low,
        max(attempts),
        min(attempts),
        label,
        total,
        before=_num(begin[1]["avail"]) if begin is not None else None,
        speculative=bool(bundle.setting("speculative_algorithm")),
        noted_mfs=note["mfs"] if note is not None else None,
    )


def mem_fraction_window(bundle: Bundle) -> Diagnosis | None:
    """Attempts at two fractions where the higher ran out of GPU memory and the lower left no
    KV cache: no value of mem-fraction-static works for this configuration (§3: the fraction
    splits the free memory before load between the static pools and everything else)."""
    found = _fraction_window(bundle)
    return None if found is None else _fraction_window_diagnosis(bundle, found)


def _fraction_window_diagnosis(bundle: Bundle, found: FractionWindow) -> Diagnosis:
    numbers: dict[str, float] = {"mfs_oom": found.high, "mfs_not_enough_memory": found.lower}
    if found.gpu_total_gib is not None:
        numbers["gpu_total_gib"] = found.gpu_total_gib
    if found.before is not None:
        numbers["avail_before_load_gib"] = found.before
    speculative = ""
    if found.speculative:
        speculative = (
            " (with speculative decoding the draft model's pool is sized from what the target "
            "model and its KV pool left)"
        )
    related = ""
    if found.noted_mfs is not None:
        numbers["noted_oom_at_mfs_ge"] = float(found.noted_mfs)
        related = (
            f"; the notes add a report that runs out of memory at every --mem-fraction-static "
            f">= {found.noted_mfs}"
        )
    return Diagnosis(
        category="mem-fraction-window",
        secondary_categories=["gpu-oom-cuda-graph", "mem-fraction-too-low"],
        summary=(
            f"no workable --mem-fraction-static{_fraction_window_card(found)}: "
            f"{_fmt(found.high)} runs out of GPU memory and {_fmt(found.lower)} leaves no memory "
            f"for the KV cache{speculative}{related}; shrink the demand instead of tuning the "
            "fraction"
        ),
        remedy=(
            "reduce --max-running-requests, --cuda-graph-max-bs or --context-length (with "
            "speculative decoding also --speculative-num-draft-tokens), or use more GPUs (--tp 2)"
        ),
        evidence=[bundle.evidence(found.oom), bundle.evidence(found.low)],
        numbers=numbers,
    )


def _fraction_window_card(found: FractionWindow) -> str:
    """`` on L40S 48GB (44.39 GiB, 43.50 GiB free before the weights)``, what is known of it."""
    if not found.label and found.gpu_total_gib is None:
        return ""
    card = f" on {found.label or 'a GPU'}"
    if found.gpu_total_gib is None:
        return card
    card += f" ({found.gpu_total_gib:.2f} GiB"
    if found.before is not None:
        card += f", {found.before:.2f} GiB free before the weights"
    return card + ")"


# A frame of the traceback that names the attention backend allocating at start-up
# (sglang/srt/layers/attention/<name>_backend.py).
BACKEND_FRAME = re.compile(r"layers/attention/(?P<backend>\w+?)_backend\.py")
#: AITER's paged attention splits the context into partitions of this many tokens and sizes
#: its workspace by their count (sglang/srt/layers/attention/aiter_backend.py,
#: _AITER_PARTITION_SIZE_ROCM).
AITER_PARTITION_TOKENS = 256


def oom_beyond_the_weights(bundle: Bundle) -> Diagnosis | None:
    """Out of GPU memory at start-up, outside graph capture, for an allocation larger than all
    the weights left (free before loading − weights): with the KV pool at zero it still would
    not fit, so no --mem-fraction-static works (FORMAT.md's ``mem-fraction-window``). A smaller
    allocation is left to the rules that size the fraction."""
    oom = bundle.log.first(OOM_SINCE_2_1)
    begin, end = bundle.log.first(LOAD_BEGIN), bundle.log.first(LOAD_END)
    if oom is None or begin is None or end is None or oom[0] < end[0]:
        return None
    if any(n < oom[0] for n, _ in bundle.log.find(READY_MARK)):
        return None
    tried, free, total = (gib_of(oom[1][k]) for k in ("tried", "free", "total"))
    before, weights = _num(begin[1]["avail"]), _num(end[1]["used"])
    left = before - weights
    if tried <= left:
        return None
    numbers: dict[str, float] = {
        "tried_to_allocate_gib": tried,
        "free_gib": free,
        "gpu_total_gib": total,
        "avail_before_load_gib": before,
        "weights_gib": weights,
    }
    frames = bundle.log.lines[end[0] : oom[0]]
    backend = next((m["backend"] for m in map(BACKEND_FRAME.search, frames) if m), None)
    where = f" in the {backend} attention backend's start-up allocation" if backend else ""
    sized = ""
    context = bundle.count("context_length", default=0) or _model_context(bundle)
    if context:
        numbers["context_length"] = context
        sized = f"; it grows with the context length ({context} tokens)"
        if backend == "aiter":
            parts = -(-context // AITER_PARTITION_TOKENS)
            numbers["max_num_partitions"] = parts
            sized = (
                f"; AITER sizes that workspace by the context length: {context} / "
                f"{AITER_PARTITION_TOKENS} = {parts} partitions"
            )
    vendor = "HIP" if "HIP" in oom[1].group(0) else "CUDA"
    return Diagnosis(
        category="mem-fraction-window",
        summary=(
            f"{vendor} out of memory at start-up after the KV pool{where}: tried to allocate "
            f"{oom[1]['tried']}, {oom[1]['free']} of {oom[1]['total']} free; the weights took "
            f"{weights:.2f} of the {before:.2f} GiB free before loading, so even with no KV pool "
            f"{left:.2f} GiB < {tried:.2f} GiB: no --mem-fraction-static makes room{sized}"
        ),
        remedy=(
            "shrink the allocation: cap --context-length (and --max-running-requests), or use "
            "another attention backend (--attention-backend triton); or free GPU memory / use a "
            "GPU with more of it free"
        ),
        evidence=[bundle.evidence(oom), bundle.evidence(begin), bundle.evidence(end)],
        numbers=numbers,
    )


def _model_context(bundle: Bundle) -> int:
    """The model's own context length (config.json ``max_position_embeddings``), else 0."""
    config = bundle.facts.get("model_config") or {}
    value = config.get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else 0


# Where a log is loading the weights (SGLang, vLLM V0 and V1), where it has finished, and the
# traceback frames of code that allocates them.
LOADING_MARK = re.compile(
    r"Load weight begin|Loading safetensors checkpoint shards|Using model weights format|"
    r"Starting to load model|Loading weights|in create_weights|in load_weights|"
    r"in weight_loader|in load_model"
)
LOADED_MARK = re.compile(
    r"Load weight end|Loading model weights took|Model loading took|Loading weights took"
)
ALLOCATED = re.compile(r"Of the allocated memory (?P<allocated>[\d.]+ (?:[KGMT]iB|bytes))")


def oom_loading_weights(bundle: Bundle) -> Diagnosis | None:
    """Out of GPU memory while the weights load (after a loading mark, before any loaded
    mark): the weights do not fit the GPUs at this TP size (FORMAT.md ``gpu-oom-weights``).
    The rules for memory another process holds come first."""
    oom = bundle.log.first(OOM_SINCE_2_1) or bundle.log.first(OOM_BEFORE_2_1)
    if oom is None:
        return None
    loading = [n for n, _ in bundle.log.find(LOADING_MARK) if n <= oom[0] + 40]
    loaded = [n for n, _ in bundle.log.find(LOADED_MARK) if n < oom[0]]
    if not loading or loaded:
        return None
    tp = bundle.tp()
    visible = bundle.visible_gpus()
    numbers: dict[str, float] = {"tensor_parallel_size": tp}
    said = (
        f"GPU out of memory while loading the weights on {bundle.gpu_named(oom[1]['gpu'])} "
        f"(TP {tp}): tried to allocate {oom[1]['tried']}, {oom[1]['free']} of "
        f"{oom[1]['total']} free"
    )
    numbers.update(
        tried_to_allocate_gib=round(gib_of(oom[1]["tried"]), 2),
        free_gib=round(gib_of(oom[1]["free"]), 2),
        gpu_total_gib=round(gib_of(oom[1]["total"]), 2),
    )
    allocated = ALLOCATED.search(oom[1].string)
    if allocated is not None:
        numbers["allocated_by_pytorch_gib"] = round(gib_of(allocated["allocated"]), 2)
        said += f", {allocated['allocated']} already allocated by PyTorch"
    wider = None
    if visible:
        numbers["visible_gpus"] = visible
        if visible > tp:
            wider = visible
            said += f"; {visible} GPUs are visible but TP {tp} puts the weights on {tp}"
    said += f": the weights do not fit {tp} GPU{'s' if tp > 1 else ''}"
    weights = bundle.facts.get("model_weights_bytes")
    if isinstance(weights, int) and weights > 0:
        numbers["weights_gb"] = round(weights / 1e9, 2)
        said += f" ({weights / 1e9:.2f} GB of weights)"
    if wider:
        numbers["suggested_tp_size"] = wider
    flag = "--tensor-parallel-size" if bundle.vllm else "--tp-size"
    return Diagnosis(
        category="gpu-oom-weights",
        summary=said,
        remedy=(
            f"shard the weights over more GPUs: {flag} "
            + (str(wider) if wider else "N")
            + " (tensor parallelism across the visible GPUs), or a quantized checkpoint "
            "(AWQ/GPTQ/int4/FP8), or a smaller model"
        ),
        evidence=[bundle.evidence(oom)],
        numbers=numbers,
    )


#: The line that alone shows each rule's failure, whatever its figures say (engine._unreadable).
RECOGNISES: dict[Rule, tuple[str, re.Pattern[str]]] = {
    gpu_oom_cuda_graph: (
        "gpu-oom-cuda-graph",
        re.compile(r"Capture (?:prefill )?(?:cuda|CUDA) graph failed: .*out of memory"),
    ),
    mem_fraction_too_low: ("mem-fraction-too-low", NOT_ENOUGH_KV),
}
