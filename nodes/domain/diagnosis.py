"""Why a launch failed, from its bundle: the category, a one-line summary with the numbers, the
evidence it rests on (log lines with their numbers, snapshot facts), the remedy, the figures.

Rules are tried in order; each is a small function over the evidence: log signatures (exact
texts SGLang prints, shared/reference/sglang.md §6), the memory arithmetic of the command that
ran, and the node's snapshots. The first rule that recognises the failure names its category
(the immediate cause, as tests/fixtures/cases/FORMAT.md asks). When no rule does, the answer is
``unknown`` with what evidence would settle it, never a guess.

Units: SGLang prints ``avail mem=``/``mem usage=`` in GiB and its host-pool figures in decimal
GB; ``numbers`` keys carry the unit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from nodes.domain.geometry import GeometryError, from_config, kv_bytes_per_token, kv_elem_bytes

GiB = 2**30
#: SGLang keeps this much host memory back in its HiCache check (§2): 10 GiB, printed as GB.
HOST_RESERVE_GB = 10 * GiB / 1e9


@dataclass(frozen=True)
class Evidence:
    """A log line (1-based ``line``) or a snapshot fact (``line`` is ``None``)."""

    text: str
    line: int | None = None
    source: str = "log"


@dataclass
class Diagnosis:
    category: str
    summary: str
    remedy: str
    evidence: list[Evidence] = field(default_factory=list)
    numbers: dict[str, float] = field(default_factory=dict)
    secondary_categories: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """``{"category", "secondary_categories", "summary", "evidence", "remedy", "numbers"}``."""
        return {
            "category": self.category,
            "secondary_categories": list(self.secondary_categories),
            "summary": self.summary,
            "evidence": [asdict(e) for e in self.evidence],
            "remedy": self.remedy,
            "numbers": dict(self.numbers),
        }


class Log:
    """The launch log, searchable by pattern, with 1-based line numbers."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()

    def find(self, pattern: str | re.Pattern[str]) -> list[tuple[int, re.Match[str]]]:
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        found = []
        for number, line in enumerate(self.lines, 1):
            match = regex.search(line)
            if match:
                found.append((number, match))
        return found

    def first(self, pattern: str | re.Pattern[str]) -> tuple[int, re.Match[str]] | None:
        hits = self.find(pattern)
        return hits[0] if hits else None


@dataclass
class Bundle:
    """What a rule reads: the log, the facts document, and the command's flags by dest."""

    log: Log
    facts: Mapping[str, Any]
    flags: Mapping[str, Any]

    def evidence(self, hit: tuple[int, re.Match[str]]) -> Evidence:
        number, _ = hit
        return Evidence(self.log.lines[number - 1].strip()[:500], number)

    def flag(self, *dests: str, default: Any = None) -> Any:
        for dest in dests:
            value = self.flags.get(dest)
            if value is not None:
                return value
        return default

    def host_ram_gb(self) -> float | None:
        ram = (self.facts.get("node") or {}).get("host_ram_bytes")
        return ram / 1e9 if isinstance(ram, int | float) and ram > 0 else None


Rule = Callable[[Bundle], Diagnosis | None]


def _num(text: str) -> float:
    return float(text)


def _fmt(value: float, places: int = 2) -> str:
    """Numbers as an operator reads them: 40 not 40.00, 44.87 kept."""
    text = f"{value:.{places}f}".rstrip("0").rstrip(".")
    return text if text not in ("-0", "") else "0"


# --- rules -------------------------------------------------------------------------------------

PRECHECK = re.compile(
    r"Not enough host memory available\. Requesting (?P<requested>[\d.]+) GB but only have "
    r"(?P<free>[\d.]+) GB free"
)


def host_precheck(bundle: Bundle) -> Diagnosis | None:
    """SGLang's own host-memory check refused the HiCache pool (§2, §6)."""
    hit = bundle.log.first(PRECHECK)
    if hit is None:
        return None
    requested, free = _num(hit[1]["requested"]), _num(hit[1]["free"])
    usable = free - HOST_RESERVE_GB
    short = requested - usable
    reserve = round(HOST_RESERVE_GB, 2)
    return Diagnosis(
        category="host-mem-precheck",
        secondary_categories=["host-oom-hicache"],
        summary=(
            f"host RAM precheck failed: hicache {_fmt(requested)} GB requested, {_fmt(free)} GB "
            f"free minus SGLang's fixed 10 GiB ({_fmt(reserve)} GB) reserve = {_fmt(usable)} GB "
            f"usable (short by {_fmt(short)} GB)"
        ),
        remedy=(
            f"reduce --hicache-size so that --hicache-size <= MemAvailable - {_fmt(reserve)} GB "
            f"({math.floor(usable)} GB per rank here; the 10 GiB reserve is SGLang's own), or "
            "free host memory before launching"
        ),
        evidence=[bundle.evidence(hit)],
        numbers={
            "requested_gb": requested,
            "reported_free_gb": free,
            "reserve_gb": reserve,
            "effective_free_gb": round(usable, 2),
            "shortfall_gb": round(short, 2),
        },
    )


NOT_ENOUGH_KV = re.compile(
    r"Not enough memory\. Please try to increase --mem-fraction-static|Loaded weights leave no "
    r"GPU memory for the KV cache"
)
LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=(?P<avail>[\d.]+) GB")
LOAD_END = re.compile(
    r"Load weight end\..*?avail mem=(?P<avail>[\d.]+) GB, mem usage=(?P<used>[\d.]+)"
)


def mem_fraction_too_low(bundle: Bundle) -> Diagnosis | None:
    """Weights leave no KV space: mem-fraction-static keeps (1 − mfs) × the free memory before
    the weights for activations, and what is left after the weights is less (§3)."""
    hit = bundle.log.first(NOT_ENOUGH_KV)
    begin, end = bundle.log.first(LOAD_BEGIN), bundle.log.first(LOAD_END)
    mfs = bundle.flag("mem_fraction_static")
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


HOST_POOL = re.compile(
    r"(?:\[[^\]]*?(?P<rank>(?:DP\d+_)?TP\d+)[^\]]*\] )?.*?(?:Allocating (?P<old>[\d.]+) GB host "
    r"memory for hierarchical KV cache|hierarchical KV host pool: \d+ tokens, (?P<new>[\d.]+) GB)"
)


def _available_before(bundle: Bundle) -> float | None:
    """MemAvailable (GB) in the last snapshot taken before the launch, if any."""
    for snapshot in reversed(bundle.facts.get("snapshots") or []):
        if snapshot.get("phase") == "before_launch":
            value = (snapshot.get("meminfo") or {}).get("MemAvailable")
            return value / 1e9 if isinstance(value, int | float) and value > 0 else None
    return None


def host_oom_hicache(bundle: Bundle) -> Diagnosis | None:
    """The host pools SGLang says it pins, summed over the ranks on this node, exceed the
    node's memory: each rank checked alone (≤ 0.5.18), so none refused (§2, §6)."""
    hits = bundle.log.find(HOST_POOL)
    if not hits:
        return None
    per_rank: dict[str, list[float]] = {}
    for number, match in hits:
        rank = match["rank"] or f"line{number}"
        per_rank.setdefault(rank, []).append(_num(match["old"] or match["new"]))
    ranks = len(per_rank)
    pools = max(per_rank.values(), key=len)
    each = round(sum(pools), 2)
    total = round(sum(sum(v) for v in per_rank.values()), 2)
    ram, before = bundle.host_ram_gb(), _available_before(bundle)
    limit = before if before is not None else ram
    if limit is None or total <= limit:
        return None
    tp = int(bundle.flag("tp_size", "tensor_parallel_size", default=ranks) or ranks)
    numbers = {
        "tp_size": tp,
        "local_ranks": ranks,
        "hicache_size_gb_per_rank": pools[0],
        "per_rank_total_gb": each,
        "aggregate_gb": total,
    }
    if len(pools) > 1:
        parts = " + ".join(f"{_fmt(p)} GB" for p in pools)
        per = f"host pools {parts} = {_fmt(each)} GB per rank"
        numbers["dsa_indexer_gb_per_rank"] = pools[1]
    else:
        per = f"--hicache-size {_fmt(each)} GB is per TP rank; {ranks} ranks"
    against = f"{_fmt(limit)} GB {'available' if before is not None else 'host RAM'}"
    if ram is not None:
        numbers["host_ram_gb"] = round(ram, 2)
        if before is not None:
            numbers["mem_available_before_gb"] = round(before, 2)
            against += f" ({_fmt(ram)} GB host RAM)"
    if len(pools) > 1:
        summary = (
            f"host RAM exhausted: {per} x {ranks} local ranks = {_fmt(total)} GB > {against}; "
            "SGLang checked each rank alone"
        )
    else:
        summary = f"host RAM exhausted: {per} x {_fmt(each)} GB = {_fmt(total)} GB > {against}"
    meant = math.floor(pools[0] / ranks)
    fits = math.floor((limit - HOST_RESERVE_GB) / ranks - (each - pools[0]))
    evidence = [bundle.evidence(hit) for hit in hits[: ranks * len(pools)]]
    for snapshot in bundle.facts.get("snapshots") or []:
        for line in (snapshot.get("kernel_log") or [])[:3]:
            evidence.append(Evidence(str(line)[:300], None, "snapshot"))
    return Diagnosis(
        category="host-oom-hicache",
        summary=summary,
        remedy=(
            f"--hicache-size is per rank (the aggregate across local ranks is what the node "
            f"must hold): reduce --hicache-size to at most {max(fits, 0)} GB per rank here; if "
            f"{_fmt(pools[0])} GB was meant for the whole node, that is --hicache-size {meant}"
        ),
        evidence=evidence,
        numbers=numbers,
    )


UNBALANCED = re.compile(
    r"The memory capacity is unbalanced\..*?min_per_gpu_memory=(?P<min>[\d.]+), "
    r"local_gpu_memory=(?P<local>[\d.]+)"
)


def gpu_unbalanced(bundle: Bundle) -> Diagnosis | None:
    """SGLang's check that every TP GPU has at least 90 % of the local GPU's free memory
    (``model_runner.py``, §6): another process holds memory on one of them."""
    hit = bundle.log.first(UNBALANCED)
    if hit is None:
        return None
    low, local = _num(hit[1]["min"]), _num(hit[1]["local"])
    return Diagnosis(
        category="gpu-occupied-by-other-process",
        summary=(
            f"TP GPUs have unequal free memory: the least-free GPU has {low:.2f} GB vs "
            f"{local:.2f} GB on the local GPU (below 0.9 x {local:.2f} = {0.9 * local:.2f} GB), so "
            "another process is occupying one GPU, or the GPUs are not alike"
        ),
        remedy=(
            "kill processes occupying GPU memory (see the node's GPU holders), or choose idle "
            "GPUs (CUDA_VISIBLE_DEVICES) of one model; the check can be bypassed "
            "(SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK in 0.5.2, "
            "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=0 later) only with homogeneous GPUs"
        ),
        evidence=[bundle.evidence(hit)],
        numbers={
            "min_per_gpu_memory_gb": round(low, 2),
            "local_gpu_memory_gb": round(local, 2),
            "threshold_gb": round(0.9 * local, 2),
            "imbalance_ratio": 0.9,
        },
    )


PORT_WAIT = re.compile(
    r"(?P<name>\w+_port) at (?P<port>\d+) is not available in (?P<wait>\d+) seconds"
)


def port_in_use(bundle: Bundle) -> Diagnosis | None:
    """SGLang waited for a port it needs (``wait_port_available``, §6); the snapshot says who
    holds it."""
    hit = bundle.log.first(PORT_WAIT)
    if hit is None:
        return None
    name, port, wait = hit[1]["name"], int(hit[1]["port"]), int(hit[1]["wait"])
    numbers: dict[str, float] = {"port": port, "wait_seconds": wait}
    holder, evidence = "", [bundle.evidence(hit)]
    secondary: list[str] = []
    for snapshot in reversed(bundle.facts.get("snapshots") or []):
        owners = [p for p in snapshot.get("listening_ports") or [] if p.get("port") == port]
        processes = {p.get("pid"): p for p in snapshot.get("processes") or []}
        candidates = [o.get("pid") for o in owners] or [
            pid for pid, p in processes.items() if "sglang" in str(p.get("cmdline", ""))
        ]
        if candidates and candidates[0] is not None:
            pid = int(candidates[0])
            process = processes.get(pid, {})
            numbers["holder_pid"] = pid
            holder = f" by PID {pid}"
            if process:
                holder += f" ({process.get('cmdline')}, PPID {process.get('ppid')}"
                if process.get("elapsed_s"):
                    holder += f", running {process['elapsed_s']} s"
                holder += ")"
                evidence.append(Evidence(f"PID {pid}: {process.get('cmdline')}", None, "snapshot"))
                if process.get("ppid") == 1 and "sglang" in str(process.get("cmdline")):
                    secondary = ["defunct-zombie-process"]
                    holder += ", an SGLang process of an earlier launch left behind"
            break
    return Diagnosis(
        category="port-in-use",
        secondary_categories=secondary,
        summary=(
            f"port {port} ({name}) was still held{holder}; SGLang waited {wait} seconds for it"
        ),
        remedy=(
            "kill the leftover sglang process holding the port (kill by process group: "
            "kill -TERM -<pgid>, not by name), clean up before relaunch, or choose another port"
        ),
        evidence=evidence,
        numbers=numbers,
    )


SHM_SEGMENT = re.compile(
    r"Error while creating shared memory segment /dev/shm/nccl-\S* \(size (?P<size>\d+)\)"
)


def nccl_shm(bundle: Bundle) -> Diagnosis | None:
    """NCCL could not create its shared-memory segment: /dev/shm is too small (Docker's
    default is 64 MB)."""
    hit = bundle.log.first(SHM_SEGMENT)
    if hit is None:
        return None
    segment = int(hit[1]["size"])
    tp = int(bundle.flag("tp_size", "tensor_parallel_size", default=1) or 1)
    numbers: dict[str, float] = {"tp_size": tp, "nccl_segment_bytes": segment}
    size = ""
    for snapshot in reversed(bundle.facts.get("snapshots") or []):
        shm = snapshot.get("shm") or {}
        if shm.get("size_bytes"):
            numbers["shm_size_mb"] = round(shm["size_bytes"] / 2**20)
            size = f" is only {numbers['shm_size_mb']:g} MB"
            break
    numbers["recommended_shm_gb"] = 16
    return Diagnosis(
        category="nccl-shm",
        summary=(
            f"/dev/shm{size}: NCCL cannot create its {segment / 1e6:.1f} MB ({segment} bytes) "
            f"shared-memory segments between the {tp} TP ranks (16 GB recommended)"
        ),
        remedy=(
            "give the container a larger /dev/shm: docker run --shm-size 16g (or --ipc=host); "
            "in Kubernetes an emptyDir with medium: Memory and a sizeLimit mounted at /dev/shm"
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


REMOTE_CODE = re.compile(
    r"requires you to execute the configuration file in that repo|"
    r"contains custom code which must be executed"
)


def trust_remote_code(bundle: Bundle) -> Diagnosis | None:
    """transformers refuses a model that ships its own code without --trust-remote-code (§6)."""
    hit = bundle.log.first(REMOTE_CODE)
    if hit is None:
        return None
    return Diagnosis(
        category="trust-remote-code",
        summary=(
            "the model ships custom config/model code (auto_map in config.json) and the launch "
            "did not pass --trust-remote-code"
        ),
        remedy=(
            "review the repo's code, then add --trust-remote-code (and pin the model revision "
            "you reviewed)"
        ),
        evidence=[bundle.evidence(hit)],
    )


NOT_DIVISIBLE = re.compile(
    r"AssertionError: (?P<dim>\d+) is not divisible by (?P<tp>\d+)|Total number of attention "
    r"heads \((?P<heads>\d+)\) must be divisible by tensor parallel size \((?P<tp2>\d+)\)"
)


def tp_divisibility(bundle: Bundle) -> Diagnosis | None:
    """A sharded dimension (attention heads, the vision tower's heads) is not a multiple of the
    TP size."""
    hit = bundle.log.first(NOT_DIVISIBLE)
    if hit is None:
        return None
    dim = int(hit[1]["dim"] or hit[1]["heads"])
    tp = int(hit[1]["tp"] or hit[1]["tp2"])
    valid = [d for d in range(1, dim + 1) if dim % d == 0]
    nearest = min((d for d in valid if d != tp), key=lambda d: (abs(d - tp), -d))
    what = "attention heads" if hit[1]["heads"] else "heads of a sharded layer (e.g. vision heads)"
    numbers: dict[str, float] = {"tp_size": tp, "attention_heads": dim}
    weights = bundle.facts.get("model_weights_bytes")
    fit = ""
    if isinstance(weights, int | float) and weights > 0:
        bigger = min((d for d in valid if d > tp), default=nearest)
        per_gpu = math.floor(weights / 1e9 / bigger * 10 + 0.5) / 10  # half up, as people round
        numbers.update(weights_gb=round(weights / 1e9), weights_gb_per_gpu=per_gpu)
        fit = f"; {weights / 1e9:.0f} GB of weights are {per_gpu} GB per GPU at TP {bigger}"
    return Diagnosis(
        category="tp-divisibility",
        summary=(
            f"tensor-parallel size {tp} does not divide the model's {dim} {what}; valid TP sizes "
            f"are {', '.join(map(str, valid))}{fit}"
        ),
        remedy=(
            f"tp must divide attention heads: use --tp {nearest} (valid: "
            f"{', '.join(map(str, valid))}), or pipeline parallel instead"
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


ORDINAL = re.compile(r"CUDA error: invalid device ordinal")


def tp_gpu_mapping(bundle: Bundle) -> Diagnosis | None:
    """A rank asked for a device index beyond CUDA_VISIBLE_DEVICES (``--base-gpu-id`` is an
    index into the visible devices, not a physical id)."""
    hit = bundle.log.first(ORDINAL)
    if hit is None:
        return None
    visible = str((bundle.facts.get("env") or {}).get("CUDA_VISIBLE_DEVICES") or "")
    count = len([v for v in visible.split(",") if v.strip()]) if visible else None
    base = int(bundle.flag("base_gpu_id", default=0) or 0)
    tp = int(bundle.flag("tp_size", "tensor_parallel_size", default=1) or 1)
    numbers: dict[str, float] = {"base_gpu_id": base, "tp_size": tp}
    summary = f"GPU index out of range: base_gpu_id {base} with tp {tp}"
    remedy = "--base-gpu-id is an index into CUDA_VISIBLE_DEVICES; do not set both to physical ids"
    if count:
        highest = count - tp
        numbers.update(visible_count=count, max_valid_base_gpu_id=highest)
        summary += (
            f", but CUDA_VISIBLE_DEVICES={visible} remaps the {count} visible GPUs to "
            f"0..{count - 1}, so a rank asks for device {base + tp - 1} of {count}"
        )
        remedy += f": --base-gpu-id {max(highest, 0)} at most (base_gpu_id + tp*dp <= visible GPUs)"
    return Diagnosis(
        category="tp-gpu-mapping",
        summary=summary,
        remedy=remedy,
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


GRAPH_OOM = re.compile(
    r"Capture (?:prefill )?(?:cuda|CUDA) graph failed: .*?Tried to allocate "
    r"(?P<tried>[\d.]+) GiB\. GPU (?P<gpu>\d+) has a total capacity of (?P<total>[\d.]+) GiB of "
    r"which (?P<free>[\d.]+) "
    r"GiB is free"
)


def gpu_oom_cuda_graph(bundle: Bundle) -> Diagnosis | None:
    """Out of GPU memory while capturing CUDA graphs: what mem-fraction-static left outside the
    static pool (activations, graphs) was too little (§6)."""
    hit = bundle.log.first(GRAPH_OOM)
    if hit is None:
        return None
    tried, gpu = _num(hit[1]["tried"]), int(hit[1]["gpu"])
    total, free = _num(hit[1]["total"]), _num(hit[1]["free"])
    mfs = bundle.flag("mem_fraction_static")
    numbers: dict[str, float] = {
        "tried_to_allocate_gib": tried,
        "free_gib_at_oom": free,
        "gpu_total_gib": total,
        "failing_gpu": gpu,
    }
    keeps = ""
    begin = bundle.log.first(LOAD_BEGIN)
    if mfs is not None and begin is not None:
        before = _num(begin[1]["avail"])
        reserved = round((1 - float(mfs)) * before, 2)
        numbers.update(mem_fraction_static_failing=float(mfs), reserved_gib_for_graphs=reserved)
        keeps = (
            f": --mem-fraction-static {_fmt(float(mfs))} keeps only {_fmt(1 - float(mfs))} x "
            f"{before:.2f} = {reserved:.2f} GiB for graphs and activations"
        )
    extra = ""
    if bundle.flag("enable_hierarchical_cache"):
        ratio, page = bundle.flag("hicache_ratio", default=2.0), bundle.flag("page_size") or 1
        numbers.update(hicache_ratio=float(ratio), page_size=int(page))
        extra = (
            f"; HiCache (hicache_ratio {_fmt(float(ratio))}, page_size {page}) adds transfer "
            "buffers on top"
        )
    return Diagnosis(
        category="gpu-oom-cuda-graph",
        secondary_categories=["mem-fraction-too-high"],
        summary=(
            f"GPU OOM during CUDA-graph capture on GPU {gpu} (tried to allocate {tried:.2f} GiB, "
            f"{free:.2f} GiB of {_fmt(total)} GiB free){keeps}{extra}"
        ),
        remedy=(
            "lower --mem-fraction-static (re-tune the mem fraction when enabling HiCache), or "
            "cap graph capture with --cuda-graph-max-bs; a larger --page-size shrinks the "
            "hicache transfer buffers"
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


WARMUP = re.compile(r"Initialization failed\. warmup error")
WARMUP_STATUS = re.compile(
    r"\"(?:GET|POST) http://[^:/]+:(?P<port>\d+)/\S* HTTP/1\.1\" (?P<status>\d{3})"
)
PROXIED = re.compile(r"res=<Response \[(?P<status>\d{3})\]>")


def health_check_failure(bundle: Bundle) -> Diagnosis | None:
    """The server loaded but its own warm-up request failed, so it killed itself."""
    hit = bundle.log.first(WARMUP)
    if hit is None:
        return None
    evidence = [bundle.evidence(hit)]
    numbers: dict[str, float] = {}
    status = bundle.log.first(PROXIED) or bundle.log.first(WARMUP_STATUS)
    detail = ""
    if status is not None:
        numbers["http_status"] = int(status[1]["status"])
        evidence.append(bundle.evidence(status))
        detail = f" answered {status[1]['status']}"
    request = bundle.log.first(WARMUP_STATUS)
    proxy = ""
    if request is not None:
        numbers["port"] = int(request[1]["port"])
        line = bundle.log.lines[request[0] - 1]
        if re.search(r"http://[\d.]+:\d+ \"(?:GET|POST) http://", line):
            proxy = " through the HTTP proxy from the environment (no_proxy lacks its host)"
            evidence.append(bundle.evidence(request))
    port = f" on port {numbers['port']:g}" if "port" in numbers else ""
    return Diagnosis(
        category="health-check-failure",
        summary=(
            f"the warm-up request to the server{port} went{proxy or ' out'} and{detail}, so "
            "SGLang killed itself although the model loaded"
        ),
        remedy=(
            "set no_proxy/NO_PROXY=localhost,127.0.0.1,0.0.0.0 (or unset http_proxy for the "
            "server process), or serve on --host 127.0.0.1"
        ),
        evidence=evidence,
        numbers=numbers,
    )


LOAD_BARRIER = re.compile(
    r"could finish the model loading, but there are other ranks that didn't finish loading"
)
SHARDS = re.compile(r"checkpoint shards:\s*\d+% Completed \| (?P<done>\d+)/(?P<total>\d+)")


def startup_timeout(bundle: Bundle) -> Diagnosis | None:
    """Ranks that finished loading gave up waiting for the others at the post-load barrier."""
    hits = bundle.log.find(LOAD_BARRIER)
    if not hits:
        return None
    tp = int(bundle.flag("tp_size", "tensor_parallel_size", default=1) or 1)
    numbers: dict[str, float] = {"tp_size": tp}
    shards = bundle.log.find(SHARDS)
    loaded = ""
    if shards:
        numbers["shards"] = int(shards[-1][1]["total"])
        loaded = f" after loading {shards[-1][1]['total']} checkpoint shards"
    return Diagnosis(
        category="startup-timeout",
        summary=(
            f"model-loading barrier timed out{loaded}: {len(hits)} of {tp} TP ranks finished "
            "loading and gave up waiting for the others; a slow rank or node, unless the "
            "lagging rank was OOM-killed"
        ),
        remedy=(
            "raise the barrier timeout (SGLANG_MODEL_LOADING_TIMEOUT_S), pre-stage weights on "
            "faster local storage, check the slow node, and check for an OOM on the lagging rank"
        ),
        evidence=[bundle.evidence(hit) for hit in hits[:3]],
        numbers=numbers,
    )


CUDA_OOM = re.compile(r"(?:torch\.)?(?:cuda\.)?OutOfMemoryError: CUDA out of memory")
ATTEMPT_MFS = re.compile(r"server_args=ServerArgs\(.*?mem_fraction_static=(?P<mfs>[\d.]+)")


def mem_fraction_window(bundle: Bundle) -> Diagnosis | None:
    """Attempts at two fractions where the higher ran out of GPU memory and the lower left no
    KV cache: no value of mem-fraction-static works for this configuration."""
    oom, low = bundle.log.first(CUDA_OOM), bundle.log.first(NOT_ENOUGH_KV)
    attempts = [_num(m["mfs"]) for _, m in bundle.log.find(ATTEMPT_MFS)]
    if oom is None or low is None or len(set(attempts)) < 2:
        return None
    high, lower = max(attempts), min(attempts)
    return Diagnosis(
        category="mem-fraction-window",
        secondary_categories=["gpu-oom-cuda-graph", "mem-fraction-too-low"],
        summary=(
            f"no workable --mem-fraction-static: {_fmt(high)} runs out of GPU memory and "
            f"{_fmt(lower)} leaves no memory for the KV cache; shrink the demand instead of "
            "tuning the fraction"
        ),
        remedy=(
            "reduce --max-running-requests, --cuda-graph-max-bs or --context-length (with "
            "speculative decoding also --speculative-num-draft-tokens), or use more GPUs (--tp 2)"
        ),
        evidence=[bundle.evidence(oom), bundle.evidence(low)],
        numbers={"mfs_oom": high, "mfs_not_enough_memory": lower},
    )


def leaked_after_cleanup(bundle: Bundle) -> Diagnosis | None:
    """The latest snapshot is after a cleanup (FORMAT.md: it sets the question): GPU memory used
    with no process, and host memory that did not come back."""
    snapshots = bundle.facts.get("snapshots") or []
    if not snapshots or snapshots[-1].get("phase") != "after_cleanup":
        return None
    last = snapshots[-1]
    holders = {p.get("gpu_index") for p in last.get("gpu_processes") or []}
    held = [
        g
        for g in last.get("gpus") or []
        if (g.get("memory_used_bytes") or 0) > 2**30 and g.get("index") not in holders
    ]
    if not held:
        return None
    numbers: dict[str, float] = {}
    for g in held:
        numbers[f"gpu{g['index']}_used_mib"] = round(g["memory_used_bytes"] / 2**20)
    gpus = " and ".join(str(g["index"]) for g in held)
    used = " and ".join(f"{numbers['gpu' + str(g['index']) + '_used_mib']:g}" for g in held)
    host = ""
    meminfo = last.get("meminfo") or {}
    before = _available_before(bundle)
    if meminfo.get("MemTotal") and meminfo.get("MemAvailable") is not None:
        in_use = (meminfo["MemTotal"] - meminfo["MemAvailable"]) / 1e9
        numbers["host_used_after_cleanup_gb"] = round(in_use)
        host = f" and {in_use:.0f} GB of host RAM stays in use"
        if before is not None:
            leaked = before - meminfo["MemAvailable"] / 1e9
            numbers["leaked_host_gb"] = round(leaked)
            host += f" ({leaked:.0f} GB more than before the launch)"
    earlier = diagnose(
        "\n".join(bundle.log.lines), {**bundle.facts, "snapshots": snapshots[:-1]}, bundle.flags
    )
    cause = (
        f"; the launch itself failed as {earlier.category}" if earlier.category != "unknown" else ""
    )
    return Diagnosis(
        category="leaked-gpu-memory",
        secondary_categories=[earlier.category] if earlier.category != "unknown" else [],
        summary=(
            f"after cleanup GPU {gpus} still show {used} MiB used{host} with no owning "
            f"process{cause}"
        ),
        remedy=(
            "no owning process is left to kill: try a GPU reset (nvidia-smi --gpu-reset) where "
            "supported, else drain and reboot the node (or reload the driver)"
        ),
        evidence=[Evidence(str(n), None, "snapshot") for n in last.get("notes") or []][:4],
        numbers=numbers,
    )


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


HF_MISSING = re.compile(
    r"HFValidationError|Repo id must be in the form|is not a local folder and is not a valid "
    r"model identifier|does not appear to have a file named config\.json"
)
WORKER_IP = re.compile(r"ip=(?P<ip>\d+\.\d+\.\d+\.\d+)\)")


def model_not_found(bundle: Bundle) -> Diagnosis | None:
    """The model path does not resolve where a rank runs: a local path missing there is taken
    for a Hugging Face repo id (transformers ``utils/hub.py``, §6)."""
    hit = bundle.log.first(HF_MISSING)
    if hit is None:
        return None
    path = bundle.flag("model_path", "model", default=None)
    if path is None:
        command = list(bundle.facts.get("command") or [])
        for flag in ("--model", "--model-path"):
            if flag in command[:-1]:
                path = command[command.index(flag) + 1]
    nodes = int(bundle.facts.get("nodes_in_launch") or 1)
    numbers: dict[str, float] = {"nodes": nodes}
    where = ""
    worker = bundle.log.first(WORKER_IP)
    if nodes > 1:
        gpus = len((bundle.facts.get("node") or {}).get("gpus") or [])
        if gpus:
            numbers["gpus_total"] = gpus * nodes
        tp = bundle.flag("tp_size", "tensor_parallel_size")
        command = list(bundle.facts.get("command") or [])
        if tp is None and "--tensor-parallel-size" in command[:-1]:
            tp = command[command.index("--tensor-parallel-size") + 1]
        if tp is not None:
            numbers["tensor_parallel_size"] = int(tp)
        where = f" on the worker of a {nodes}-node launch ({numbers.get('gpus_total', '?')} GPUs"
        where += f", tp {tp})" if tp is not None else ")"
        if worker is not None:
            where += f" at {worker[1]['ip']}"
    return Diagnosis(
        category="model-not-found",
        summary=(
            f"model path {path or '?'} does not resolve{where}; the missing local path was "
            "taken for a Hugging Face repo id and failed validation"
        ),
        remedy=(
            "use the same model path on every node (a shared filesystem, or copy/rsync the "
            "weights to each node); check with test -f <path>/config.json on all nodes"
        ),
        evidence=[bundle.evidence(hit)] + ([bundle.evidence(worker)] if worker else []),
        numbers=numbers,
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


RULES: Sequence[Rule] = (
    kv_cache_too_small,
    vllm_gpu_occupied,
    model_not_found,
    leaked_after_cleanup,
    mem_fraction_window,
    gpu_oom_cuda_graph,
    health_check_failure,
    startup_timeout,
    nccl_shm,
    trust_remote_code,
    tp_divisibility,
    tp_gpu_mapping,
    host_precheck,
    mem_fraction_too_low,
    gpu_unbalanced,
    port_in_use,
    host_oom_hicache,
)


def diagnose(log_text: str, facts: Mapping[str, Any], flags: Mapping[str, Any]) -> Diagnosis:
    """The diagnosis of one bundle. ``flags`` are the command's values by dest, as the node's
    SGLang version parses them (``sglang_flags.parse_command(...).values``); never raises."""
    bundle = Bundle(Log(log_text), facts, flags)
    for rule in RULES:
        found = rule(bundle)
        if found is not None:
            return found
    return Diagnosis(
        category="unknown",
        summary="no known failure signature or memory arithmetic explains this launch",
        remedy=(
            "collect more evidence: the full server log from every rank, `dmesg -T | grep -i -E "
            "'oom|killed process'` on the node, nvidia-smi with its processes, and MemAvailable "
            "before and after the launch"
        ),
    )
