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

import ast
import ipaddress
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import cached_property
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

    @cached_property
    def server_args(self) -> dict[str, Any]:
        """The values of the last ``server_args=ServerArgs(...)`` line: what SGLang resolved for
        the attempt the log ends with (automatic values included)."""
        hits = self.log.find(SERVER_ARGS)
        values: dict[str, Any] = {}
        for match in SERVER_ARG.finditer(hits[-1][1]["args"] if hits else ""):
            try:
                values[match["key"]] = ast.literal_eval(match["value"].strip())
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                values[match["key"]] = match["value"].strip()
        return values

    def setting(self, *dests: str) -> Any:
        """A setting from the parsed command, else from the log's ``server_args`` line."""
        value = self.flag(*dests)
        if value is None:
            args = self.server_args
            value = next((args[d] for d in dests if args.get(d) is not None), None)
        return value

    def given(self, option: str) -> bool:
        """Whether the command spells ``option`` out (a default was not just applied)."""
        command = [str(a) for a in self.facts.get("command") or []]
        return any(a == option or a.startswith(option + "=") for a in command)

    def number(self, *dests: str) -> float | None:
        """A numeric setting, or ``None`` when it is unset or not a number."""
        value = self.setting(*dests)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok and math.isfinite(value) else None

    def count(self, *dests: str, default: int = 1) -> int:
        """A positive whole-number setting (a size, a count), else ``default``."""
        value = self.setting(*dests)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 1
        return int(value) if ok else default

    def tp(self) -> int:
        """The TP size: the command, the ``server_args`` line, else the highest TP tag + 1."""
        value = self.count("tp_size", "tensor_parallel_size", default=0)
        if value:
            return value
        tags = [int(n) for line in self.log.lines for n in RANK_TAG.findall(_prefix(line))]
        return max(tags) + 1 if tags else 1

    def local_ranks(self) -> int:
        """The ranks on this node: the TP size over the nodes of the launch."""
        nodes = self.facts.get("nodes_in_launch")
        nodes = nodes if isinstance(nodes, int) and nodes >= 1 else 1
        return max(self.tp() // nodes, 1)

    def snapshots(self) -> list[Mapping[str, Any]]:
        return [s for s in self.facts.get("snapshots") or [] if isinstance(s, Mapping)]

    def notes(self) -> list[str]:
        return [str(n) for s in self.snapshots() for n in s.get("notes") or []]

    def note_match(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        """The first snapshot note with ``pattern``: figures the collector wrote in words."""
        return next((m for m in map(pattern.search, self.notes()) if m), None)

    def gpu_label(self) -> str | None:
        """The node's GPU as people name it: ``L40S 48GB`` (decimal GB of the total)."""
        for gpu in (self.facts.get("node") or {}).get("gpus") or []:
            name = str((gpu or {}).get("name") or "")
            if name:
                label = re.sub(r"^(?:NVIDIA|AMD Instinct|AMD)\s+", "", name)
                total = gpu.get("memory_total_bytes")
                if isinstance(total, int | float) and total > 0 and "GB" not in label:
                    label += f" {round(total / 1e9)}GB"
                return label
        return None


SERVER_ARGS = re.compile(r"server_args=ServerArgs\((?P<args>.*)\)")
SERVER_ARG = re.compile(r"(?P<key>\w+)=(?P<value>'[^']*'|\"[^\"]*\"|\[[^\]]*\]|[^,()\[]+)")
# SGLang's log prefix: ``[YYYY-mm-dd HH:MM:SS{ DPd}{ TPt}...]`` (§3, "Log prefix format").
PREFIX = re.compile(r"^\[(?P<when>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)?(?P<tags>[^\]]*)\]")
RANK_TAG = re.compile(r"\bTP(\d+)\b")


def _prefix(line: str) -> str:
    match = PREFIX.match(line)
    return match["tags"] if match else ""


def _when(line: str) -> datetime | None:
    """The time in SGLang's log prefix, if the line has one."""
    match = PREFIX.match(line)
    try:
        return datetime.strptime(match["when"], "%Y-%m-%d %H:%M:%S") if match else None
    except ValueError:
        return None


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
            # Every rank on the node pins its own pool out of the same free memory.
            "suggested_hicache_size_gb": max(math.floor(usable / bundle.local_ranks()), 0),
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


@dataclass
class HostPools:
    """The HiCache host pools the log says each rank pins (``Allocating … GB host memory``, §2):
    per rank, the sizes in decimal GB in log order."""

    hits: list[tuple[int, re.Match[str]]]
    per_rank: dict[str, list[float]]

    @property
    def ranks(self) -> int:
        return len(self.per_rank)

    @property
    def pools(self) -> list[float]:
        return max(self.per_rank.values(), key=len)

    @property
    def each(self) -> float:
        return round(sum(self.pools), 2)

    @property
    def total(self) -> float:
        return round(sum(sum(v) for v in self.per_rank.values()), 2)


def _host_pools(bundle: Bundle) -> HostPools | None:
    hits = bundle.log.find(HOST_POOL)
    if not hits:
        return None
    per_rank: dict[str, list[float]] = {}
    for number, match in hits:
        rank = match["rank"] or f"line{number}"
        per_rank.setdefault(rank, []).append(_num(match["old"] or match["new"]))
    return HostPools(hits, per_rank)


KV_ALLOCATED = re.compile(
    r"KV Cache is allocated\..*?#tokens: (?P<tokens>\d+), (?:K size: (?P<k>[\d.]+) GB, V size: "
    r"(?P<v>[\d.]+) GB|KV size: (?P<kv>[\d.]+) GB)"
)


def _device_kv(bundle: Bundle) -> tuple[int, float] | None:
    """Tokens and GiB of one rank's device KV pool (``KV Cache is allocated``; its "GB" is GiB,
    §3)."""
    hits = bundle.log.find(KV_ALLOCATED)
    if not hits:
        return None
    match = hits[-1][1]
    gib = _num(match["kv"]) if match["kv"] else _num(match["k"]) + _num(match["v"])
    return int(match["tokens"]), round(gib, 2)


def _host_pool_source(bundle: Bundle) -> tuple[str, dict[str, float]]:
    """How the host pool was sized (§1d): ``--hicache-size`` GB per rank, else ``--hicache-ratio``
    × the rank's device KV pool, the ratio defaulting to 2.0."""
    size = bundle.setting("hicache_size")
    if isinstance(size, int | float) and size > 0:
        return f"--hicache-size {_fmt(size)} GB", {"hicache_size_gb": size}
    ratio = bundle.number("hicache_ratio") or 2.0
    numbers: dict[str, float] = {"hicache_ratio": ratio}
    source = (
        f"{'' if bundle.given('--hicache-ratio') else 'the default '}--hicache-ratio {_fmt(ratio)}"
    )
    kv = _device_kv(bundle)
    if kv is not None:
        tokens, gib = kv
        numbers.update(max_total_num_tokens=tokens, device_kv_gib_per_rank=gib)
        per_token = _kv_bytes_per_token(bundle)
        if per_token:
            numbers.update(kv_bytes_per_token=per_token)
            numbers["device_kv_gb_per_rank"] = round(tokens * per_token / 1e9, 2)
            pool = (
                f"{tokens} tokens x {per_token} B = {numbers['device_kv_gb_per_rank']:.2f} GB = "
                f"{gib:.2f} GiB"
            )
        else:
            pool = f"{tokens} tokens, {gib:.2f} GiB"
        source += f" x the rank's device KV pool ({pool})"
    return source, numbers


def _kv_bytes_per_token(bundle: Bundle) -> int | None:
    """KV bytes per token on one rank from the model's config (§3): attention TP is tp / dp
    under DP attention."""
    config = bundle.facts.get("model_config")
    if not isinstance(config, dict):
        return None
    try:
        geometry = from_config(config)
    except GeometryError:
        return None
    tp = bundle.tp()
    if bundle.setting("enable_dp_attention"):
        tp = max(1, tp // bundle.count("dp_size", "data_parallel_size"))
    pp = bundle.count("pp_size", "pipeline_parallel_size")
    dtype = str(bundle.setting("kv_cache_dtype") or "auto")
    return kv_bytes_per_token(geometry, tp, pp, kv_elem_bytes(dtype, geometry.torch_dtype))


BUDGET_NOTE = re.compile(r"(?i)\bbudget\b[^:.]*:\s*(?P<gb>\d[\d,]*(?:\.\d+)?)\s*GB\b")


def _host_share(bundle: Bundle) -> tuple[float, str] | None:
    """This server's share of the host RAM in GB: a budget stated for it, else the node's RAM
    × the fraction of the node's GPUs it uses (neighbours on the other GPUs get theirs)."""
    note = bundle.note_match(BUDGET_NOTE)
    if note is not None:
        return float(note["gb"].replace(",", "")), "this server's host budget"
    ram = bundle.host_ram_gb()
    if ram is None:
        return None
    node_gpus = len((bundle.facts.get("node") or {}).get("gpus") or [])
    used = bundle.tp() * bundle.count("pp_size", "pipeline_parallel_size")
    if not bundle.setting("enable_dp_attention"):
        used *= bundle.count("dp_size", "data_parallel_size")
    used //= bundle.count("nnodes")
    if 0 < used < node_gpus:
        return (
            ram * used / node_gpus,
            f"this server's {used}/{node_gpus} GPU share of the {_fmt(ram)} GB host",
        )
    return ram, "host RAM"


def _hicache_risk(bundle: Bundle) -> tuple[str, dict[str, float], list[Evidence]] | None:
    """The pinned host pools take more than half of this server's share of the host RAM: the
    risk behind another failure (secondary ``host-oom-hicache``; §2, §9 rule 1)."""
    pools, share = _host_pools(bundle), _host_share(bundle)
    if pools is None or share is None or pools.total <= 0.5 * share[0]:
        return None
    source, numbers = _host_pool_source(bundle)
    numbers.update(
        hicache_gb_per_rank=pools.each,
        local_ranks=pools.ranks,
        hicache_gb_total=pools.total,
        host_share_gb=round(share[0], 2),
    )
    ram = bundle.host_ram_gb()
    if ram is not None:
        numbers["host_ram_gb"] = round(ram, 2)
    text = (
        f"{source} makes {pools.each:.2f} GB of pinned host pool per rank x {pools.ranks} ranks "
        f"= {pools.total:.2f} GB, {pools.total / share[0]:.2f} of {share[1]}"
    )
    return text, numbers, [bundle.evidence(hit) for hit in pools.hits[: pools.ranks]]


def host_oom_hicache(bundle: Bundle) -> Diagnosis | None:
    """The host pools SGLang says it pins, summed over the ranks on this node, exceed the
    node's memory: each rank checked alone (≤ 0.5.18), so none refused (§2, §6)."""
    found = _host_pools(bundle)
    if found is None:
        return None
    ranks, pools, each, total = found.ranks, found.pools, found.each, found.total
    hits = found.hits
    ram, before = bundle.host_ram_gb(), _available_before(bundle)
    limit = before if before is not None else ram
    if limit is None or total <= limit:
        return None
    tp = bundle.count("tp_size", "tensor_parallel_size", default=ranks)
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
    if fits > 0:
        numbers["suggested_hicache_size_gb"] = fits
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


NODE_OOM_KILL = re.compile(r"Out of memory: Killed process (?P<pid>\d+)")
SHELL_KILLED = re.compile(r"^\S+: line \d+:\s+(?P<pid>\d+) Killed\s")


def host_oom_pinned(bundle: Bundle) -> Diagnosis | None:
    """The host pools fit at start-up, but pinned (``cudaHostRegister``/``pin_memory``, §2) they
    cannot be reclaimed, and the kernel's OOM killer struck later: the pools' share of this
    server's host budget is what to show. Needs the kernel's ``Out of memory: Killed process``."""
    pools = _host_pools(bundle)
    kills = [
        Evidence(str(line)[:300], None, "snapshot")
        for s in bundle.snapshots()
        for line in s.get("kernel_log") or []
        if NODE_OOM_KILL.search(str(line))
    ]
    if pools is None or not kills:
        return None
    source, numbers = _host_pool_source(bundle)
    tp = bundle.tp()
    numbers.update(
        tp_size=tp,
        hicache_gb_per_rank=pools.each,
        local_ranks=pools.ranks,
        hicache_gb_total=pools.total,
    )
    share = _host_share(bundle) or (
        (before, "the memory available before the launch")
        if (before := _available_before(bundle)) is not None
        else None
    )
    against, fits = "", ""
    if share is not None:
        budget, what = share
        numbers.update(host_budget_gb=round(budget, 2))
        numbers["fraction_of_budget_pinned"] = round(pools.total / budget, 2)
        against = f", {pools.total / budget:.2f} of {what} ({_fmt(budget)} GB)"
        # Pinned memory is never reclaimed: keep the pools under half of the share (§9 rule 1).
        numbers["suggested_hicache_size_gb"] = math.floor(0.5 * budget / pools.ranks)
        fits = f"; --hicache-size {math.floor(0.5 * budget / pools.ranks)} or less per rank keeps "
        fits += "the pinned total under half of the host budget share"
    evidence = [bundle.evidence(hit) for hit in pools.hits[: pools.ranks]]
    killed = bundle.log.first(SHELL_KILLED)
    if killed is not None:
        evidence.append(bundle.evidence(killed))
    return Diagnosis(
        category="host-oom-hicache",
        summary=(
            f"host RAM exhausted after start-up: {source} = {pools.each:.2f} GB pinned per rank x "
            f"{pools.ranks} ranks (TP {tp}) = {pools.total:.2f} GB{against}; pinned pages cannot "
            "be reclaimed, so later load drove the node into the kernel OOM killer"
        ),
        remedy=(
            "size the host pool in absolute GB with --hicache-size (an absolute size per rank; "
            "--hicache-ratio is relative to the device KV pool, so a large device pool makes a "
            f"huge pinned host pool), or reduce --hicache-ratio{fits}"
        ),
        evidence=evidence + kills[:2],
        numbers=numbers,
    )


CGROUP_OOM = re.compile(r"Memory cgroup out of memory|OOMKilled")
LOAD_NOTE = re.compile(r"(?P<tokens>\d[\d,]*)-token\b.*?\bconcurrency (?P<concurrency>\d+)")
NEW_SEQ = re.compile(r"#new-seq: (?P<seqs>\d+),.*?#running-req: (?P<running>\d+)")


def host_oom_cgroup(bundle: Bundle) -> Diagnosis | None:
    """A container's memory limit (cgroup ``memory.max``), not the node's RAM, ran out: the
    kernel's ``Memory cgroup out of memory`` or the runtime's ``OOMKilled``. HiCache pools are
    booked against the whole host's free memory up to 0.5.20 (§2), so they can fill a limit."""
    facts = [line for s in bundle.snapshots() for line in s.get("kernel_log") or []]
    facts += bundle.notes()
    signs = [Evidence(text[:300], None, "snapshot") for text in facts if CGROUP_OOM.search(text)]
    signs += [bundle.evidence(hit) for hit in bundle.log.find(CGROUP_OOM)]
    if not signs:
        return None
    limit, samples = None, []
    for snapshot in bundle.snapshots():
        cgroup = snapshot.get("cgroup_memory") or {}
        if isinstance(cgroup.get("max_bytes"), int | float) and cgroup["max_bytes"] > 0:
            limit = cgroup["max_bytes"]
        if snapshot.get("phase") == "during" and isinstance(
            cgroup.get("current_bytes"), int | float
        ):
            samples.append((cgroup["current_bytes"], snapshot))
    tp = bundle.tp()
    numbers: dict[str, float] = {"tp_size": tp}
    parts = [f"container memory limit hit (TP {tp})"]
    if limit is not None:
        numbers["cgroup_limit_gib"] = round(limit / GiB, 2)
        parts[0] += f": cgroup memory.max is {limit / GiB:.0f} GiB"
    if samples and limit is not None:
        idle, peak = samples[0][0], max(samples, key=lambda s: s[0])
        numbers.update(
            idle_usage_gib=round(idle / GiB, 2),
            idle_fraction_of_limit=round(idle / limit, 2),
            peak_usage_gib=round(peak[0] / GiB, 2),
        )
        usage = (
            f"memory.current was {idle / GiB:.0f} GiB after start-up ({idle / limit:.2f} of the "
            f"limit) and {peak[0] / GiB:.0f} GiB at the peak"
        )
        load = next((LOAD_NOTE.search(str(n)) for n in peak[1].get("notes") or []), None)
        seqs = [int(m["seqs"]) + int(m["running"]) for _, m in bundle.log.find(NEW_SEQ)]
        if load is not None:
            numbers.update(
                load_tokens=int(load["tokens"].replace(",", "")),
                concurrency=int(load["concurrency"]),
            )
            usage += f" (under a {numbers['load_tokens']:g}-token load at concurrency "
            usage += f"{load['concurrency']})"
        elif seqs:
            numbers["concurrency"] = max(seqs)
            usage += f" (under load, up to {max(seqs)} requests at once)"
        parts.append(usage)
    pools = _host_pools(bundle)
    secondary, fits = [], ""
    if pools is not None:
        secondary = ["host-oom-hicache"]
        source, figures = _host_pool_source(bundle)
        numbers.update(figures, hicache_gb_total=pools.total)
        parts.append(
            f"{pools.ranks} ranks pin {pools.ranks} x {pools.each:.2f} GB = {pools.total:.2f} GB "
            f"of HiCache host pools ({source}) inside it"
        )
        if samples and limit is not None:
            # What the pools may take so that the observed peak stays under 80 % of the limit.
            other = samples[0][0] / 1e9 - pools.total
            growth = (max(s[0] for s in samples) - samples[0][0]) / 1e9
            room = math.floor((0.8 * limit / 1e9 - other - growth) / pools.ranks)
            if room > 0:
                numbers["suggested_hicache_size_gb"] = room
                fits = f" ({room} GB per rank here keeps the observed peak under 80 % of the limit)"
    return Diagnosis(
        category="host-oom-cgroup",
        secondary_categories=secondary,
        summary="; ".join(parts) + ", then the kernel OOM-killed the container's process",
        remedy=(
            "size HiCache against the cgroup memory.max (the container limit not host RAM): "
            f"lower --hicache-ratio or set --hicache-size{fits}; or raise the container's memory "
            "limit, and keep headroom for runtime growth"
        ),
        evidence=signs[:3] + ([bundle.evidence(h) for h in pools.hits[:2]] if pools else []),
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


def _port_holder(
    bundle: Bundle, port: int
) -> tuple[str, dict[str, float], list[Evidence], list[str]]:
    """Who holds ``port`` in the latest snapshot that says: the listener, else an SGLang
    process; one re-parented to PID 1 is a leftover of an earlier launch."""
    numbers: dict[str, float] = {}
    holder, evidence, secondary = "", [], []
    for snapshot in reversed(bundle.snapshots()):
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
    return holder, numbers, evidence, secondary


def port_in_use(bundle: Bundle) -> Diagnosis | None:
    """SGLang waited for a port it needs (``wait_port_available``, §6); the snapshot says who
    holds it."""
    hit = bundle.log.first(PORT_WAIT)
    if hit is None:
        return None
    name, port, wait = hit[1]["name"], int(hit[1]["port"]), int(hit[1]["wait"])
    holder, numbers, evidence, secondary = _port_holder(bundle, port)
    numbers = {"port": port, "wait_seconds": wait, **numbers}
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
        evidence=[bundle.evidence(hit), *evidence],
        numbers=numbers,
    )


BIND_IN_USE = re.compile(
    r"ZMQError: Address already in use(?: \(addr='(?P<addr>[^']*?):(?P<port>\d+)'\))?|"
    r"\[Errno 98\] (?:error while attempting to bind on address \('(?P<host>[^']*)', "
    r"(?P<port2>\d+)\): )?[Aa]ddress already in use"
)
#: With DP attention on one node SGLang's ZMQ sockets are TCP from --port + 233 (§1b).
ZMQ_TCP_PORT_DELTA = 233


def port_bind_in_use(bundle: Bundle) -> Diagnosis | None:
    """A bind failed with ``Address already in use``: a ZMQ socket of SGLang (its ports are
    derived from ``--port``, §1b) or the HTTP server (uvicorn, §6). Co-located servers whose
    ``--port`` values are close claim overlapping derived blocks."""
    hit = bundle.log.first(BIND_IN_USE)
    if hit is None:
        return None
    match = hit[1]
    where = match["addr"] or match["host"]
    port = int(match["port"] or match["port2"] or 0)
    base = bundle.setting("port")
    numbers: dict[str, float] = {"colliding_port": port} if port else {}
    what = f"{'ZMQ' if 'ZMQ' in match[0] else 'HTTP'} bind to {where or '?'}:{port or '?'}"
    derived = ""
    if port and isinstance(base, int) and 0 < port - base < 1000:
        numbers.update(port=base, offset_from_port=port - base)
        derived = (
            f"; {port} = --port {base} + {port - base}, inside the block SGLang derives from "
            f"--port (ZMQ/NCCL/metrics ports; TCP from --port + {ZMQ_TCP_PORT_DELTA} with DP "
            "attention), which a co-located server with a nearby --port overlaps"
        )
    holder, held, evidence, secondary = _port_holder(bundle, port) if port else ("", {}, [], [])
    numbers.update(held)
    behind = ""
    risk = _hicache_risk(bundle)
    if risk is not None:
        text, figures, pool_lines = risk
        numbers.update(figures)
        secondary = secondary + ["host-oom-hicache"]
        behind = f"; behind it, {text}"
        evidence += pool_lines
    hicache = ""
    if risk is not None:
        hicache = (
            "; set --hicache-size to an absolute GB per rank (it overrides --hicache-ratio) so the "
            "pinned host pools of all co-located servers fit the host"
        )
    spaced = f" (e.g. ports {base}/{base + 1000})" if isinstance(base, int) else ""
    return Diagnosis(
        category="port-in-use",
        secondary_categories=secondary,
        summary=f"{what} failed: address already in use{holder}{derived}{behind}",
        remedy=(
            f"space --port of co-located servers at least 1000 apart{spaced} and give each its "
            f"own kv-events/metrics ports, or stop the process holding the port{hicache}"
        ),
        evidence=[bundle.evidence(hit), *evidence],
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
    tp = bundle.tp()
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


DIST_BEGIN = re.compile(r"Init torch distributed begin")
# Progress past distributed init, or a Python error (then it is not a hang).
DIST_PROGRESS_OR_ERROR = re.compile(
    r"Init torch distributed ends|Load weight begin|Scheduler hit an exception|Traceback"
)
RANK_DIED = re.compile(
    r"Rank (?P<rank>\d+) scheduler (?:died|is dead)(?:.*?exit code: (?P<code>-?\d+))?", re.I
)
EXIT_CODE = re.compile(r"Exit code: (?P<code>-?\d+)")
NCCL_COMPLETE = re.compile(r"NCCL INFO .*Init COMPLETE|spans across nodes")


def _fabric(bundle: Bundle) -> tuple[str, str, dict[str, str]] | None:
    """The interface that reaches ``--dist-init-addr`` (node 0's ``host:port``, §1b) when it is
    not the default-route one, whose address a process picks for itself unless told
    (``SGLANG_HOST_IP``): (that interface, the address, the default-route interface)."""
    addr = str(bundle.setting("dist_init_addr") or "").rsplit(":", 1)[0]
    try:
        target = ipaddress.ip_address(addr)
    except ValueError:
        return None
    for snapshot in reversed(bundle.snapshots()):
        interfaces = (snapshot.get("network") or {}).get("interfaces") or []
        default = next((i for i in interfaces if i.get("default_route")), None)
        for interface in interfaces:
            try:
                network = ipaddress.ip_interface(str(interface.get("ipv4"))).network
            except ValueError:
                continue
            if target in network and default is not None and default is not interface:
                return (
                    str(interface.get("name")),
                    addr,
                    {
                        "name": str(default.get("name")),
                        "ipv4": str(default.get("ipv4")),
                    },
                )
    return None


def nccl_init_hang(bundle: Bundle) -> Diagnosis | None:
    """Distributed init began but never ended (no ``Init torch distributed ends``, no ``Load
    weight begin``, no Python error) and a rank was then found dead (``Rank N scheduler is
    dead`` / ``died``, §4, §6): the ranks waited on each other until a watchdog or timeout
    killed them. The wait is the time from the last prefixed line to the death."""
    begins = bundle.log.find(DIST_BEGIN)
    died = bundle.log.first(RANK_DIED)
    if not begins or died is None or died[0] < begins[-1][0]:
        return None
    if any(begins[-1][0] < n < died[0] for n, _ in bundle.log.find(DIST_PROGRESS_OR_ERROR)):
        return None
    code = died[1]["code"]
    if code is None:
        after = [m for n, m in bundle.log.find(EXIT_CODE) if died[0] <= n <= died[0] + 2]
        code = after[0]["code"] if after else None
    nodes = bundle.count("nnodes", default=max(1, int(bundle.facts.get("nodes_in_launch") or 1)))
    tp = bundle.tp()
    numbers: dict[str, float] = {"nnodes": nodes, "tp_size": tp}
    what = f"a {nodes}-node launch with TP {tp}" if nodes > 1 else f"TP {tp}"
    evidence = [bundle.evidence(begins[-1])]
    nccl = [h for h in bundle.log.find(NCCL_COMPLETE) if h[0] > begins[-1][0]]
    done = ""
    if nccl:
        done = " after NCCL itself initialised"
        evidence.append(bundle.evidence(nccl[-1]))
    end = _when(bundle.log.lines[died[0] - 1])
    last = next(
        (t for t in map(_when, reversed(bundle.log.lines[: died[0] - 1])) if t is not None), None
    )
    waited = ""
    if end is not None and last is not None:
        numbers["hang_seconds_until_kill"] = int((end - last).total_seconds())
        waited = f" for {numbers['hang_seconds_until_kill']:g} s"
    killed = f" (exit code {code})" if code is not None else ""
    if code is not None:
        numbers["exit_code"] = int(code)
    evidence.append(bundle.evidence(died))
    summary = (
        f"distributed init hung on {what}: 'Init torch distributed ends' never came{done}; the "
        f"ranks waited{waited} until rank {died[1]['rank']} was killed{killed}"
    )
    env = bundle.facts.get("env") or {}
    fabric = _fabric(bundle) if nodes > 1 else None
    if fabric is not None:
        name, addr, default = fabric
        unset = "" if env.get("SGLANG_HOST_IP") else " (SGLANG_HOST_IP unset)"
        summary += (
            f"; --dist-init-addr {addr} is reached on {name}, but the default route is "
            f"{default['name']} ({default['ipv4']}), the address SGLang advertises for its "
            f"cross-node message queue{unset}"
        )
        remedy = (
            "set SGLANG_HOST_IP to each node's fabric IP (set fabric IP per node: "
            f"{addr} on {name} here), and NCCL_SOCKET_IFNAME={name} / GLOO_SOCKET_IFNAME={name} "
            "on every node; the interface must be in the same subnet as dist-init-addr"
        )
    else:
        remedy = (
            "check that every node reaches --dist-init-addr on one interface: set "
            "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME to it and SGLANG_HOST_IP to each node's "
            "address on it (same subnet as dist-init-addr); NCCL_DEBUG=INFO shows where it stops"
        )
    return Diagnosis(
        category="nccl-init-hang",
        summary=summary,
        remedy=remedy,
        evidence=evidence,
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
    numbers["suggested_tp_size"] = nearest
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
    base = bundle.count("base_gpu_id", default=0)
    tp = bundle.tp()
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


CAPTURE_BS = re.compile(r"Capturing batches \(bs=(?P<bs>\d+)")
BS_NOTE = re.compile(
    r"(?i)(?:capture batch size|cuda-graph-max-bs)[^.]*?from (?P<before>\d+) to (?P<after>\d+)"
)


def gpu_oom_cuda_graph(bundle: Bundle) -> Diagnosis | None:
    """Out of GPU memory while capturing CUDA graphs: what mem-fraction-static left outside the
    static pool (activations, graphs) was too little (§3, §6). With no fraction on the command
    line the value in ``server_args`` is SGLang's automatic one (§1c)."""
    hit = bundle.log.first(GRAPH_OOM)
    if hit is None:
        return None
    tried, gpu = _num(hit[1]["tried"]), int(hit[1]["gpu"])
    total, free = _num(hit[1]["total"]), _num(hit[1]["free"])
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
    r"(?:TP rank (?P<rank>\d+) )?could finish the model loading, but there are other ranks "
    r"that didn't finish loading"
)
SHARDS = re.compile(r"checkpoint shards:\s*\d+% Completed \| (?P<done>\d+)/(?P<total>\d+)")


def startup_timeout(bundle: Bundle) -> Diagnosis | None:
    """Ranks that finished loading gave up waiting for the others at the post-load barrier
    (``other ranks that didn't finish loading``, §6). The barrier's timeout is the time from a
    failing rank's own ``Load weight end`` to its error."""
    hits = bundle.log.find(LOAD_BARRIER)
    if not hits:
        return None
    tp = bundle.tp()
    numbers: dict[str, float] = {"tp_size": tp}
    shards = bundle.log.find(SHARDS)
    loaded = ""
    if shards:
        numbers["shards"] = int(shards[-1][1]["total"])
        loaded = f" after loading {shards[-1][1]['total']} checkpoint shards"
    ends: dict[int, datetime] = {}
    for number, _ in bundle.log.find(LOAD_END):
        line = bundle.log.lines[number - 1]
        when, ranks = _when(line), RANK_TAG.findall(_prefix(line))
        if when is not None and ranks:
            ends[int(ranks[0])] = when
    finished = f"{len(ends)} of {tp} TP ranks" if ends else f"{len(hits)} of {tp} TP ranks"
    timeout = ""
    for number, match in hits:
        rank = match["rank"] or next(
            iter(RANK_TAG.findall(_prefix(bundle.log.lines[number - 1]))), None
        )
        start = ends.get(int(rank)) if rank is not None else None
        error = next(
            (t for t in map(_when, reversed(bundle.log.lines[:number])) if t is not None), None
        )
        if start is not None and error is not None:
            numbers["barrier_timeout_s"] = int((error - start).total_seconds())
            timeout = f" after the {numbers['barrier_timeout_s']:g} s barrier"
            break
    begin = bundle.log.first(LOAD_BEGIN)
    took = ""
    if begin is not None and ends and (started := _when(bundle.log.lines[begin[0] - 1])):
        typical = sorted(ends.values())[(len(ends) - 1) // 2]
        minutes = (typical - started).total_seconds() / 60
        numbers["normal_rank_load_min"] = round(minutes)
        took = f" (they loaded in about {round(minutes)} min)"
    # 1800 s is the default of the versions where the barrier's timeout became configurable.
    suggested = max(1800, 3 * int(numbers.get("barrier_timeout_s", 0)))
    return Diagnosis(
        category="startup-timeout",
        summary=(
            f"model-loading barrier timed out{loaded}: {finished} finished loading{took} and "
            f"gave up waiting for the others{timeout}; a slow rank or node, unless the lagging "
            "rank was OOM-killed"
        ),
        remedy=(
            f"raise the barrier timeout (SGLANG_MODEL_LOADING_TIMEOUT_S={suggested}), pre-stage "
            "weights on faster local storage, check the slow node, and check for an OOM on the "
            "lagging rank"
        ),
        evidence=[bundle.evidence(hit) for hit in hits[:3]],
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


@dataclass(frozen=True)
class Holder:
    """A process the node lists on a GPU, with what ``ps`` says of it (state None: not seen)."""

    pid: int
    gpu: int | None
    used_bytes: float | None
    name: str
    ppid: int | None
    state: str | None

    @property
    def alive(self) -> bool:
        return self.state is not None and self.state[:1] not in ("Z", "X")

    @property
    def orphan(self) -> bool:
        """An inference-server process re-parented to init: its launcher is gone (§4)."""
        return self.ppid == 1 and re.match(r"(?:sglang|VLLM)::", self.name) is not None


def _gpu_holders(bundle: Bundle) -> list[Holder]:
    """The GPU processes of the latest snapshot that lists any, joined with ``ps`` facts."""
    processes: dict[int, Mapping[str, Any]] = {}
    listed: list[Mapping[str, Any]] = []
    for snapshot in bundle.snapshots():
        for process in snapshot.get("processes") or []:
            if isinstance(process.get("pid"), int):
                processes[process["pid"]] = process
        if snapshot.get("gpu_processes"):
            listed = snapshot["gpu_processes"]
    holders = []
    for entry in listed:
        pid = entry.get("pid")
        if not isinstance(pid, int):
            continue
        process = processes.get(pid, {})
        holders.append(
            Holder(
                pid,
                entry.get("gpu_index"),
                entry.get("used_memory_bytes"),
                str(entry.get("name") or process.get("cmdline") or ""),
                process.get("ppid"),
                process.get("state"),
            )
        )
    return holders


OOM_WITH_HOLDER = re.compile(
    r"CUDA out of memory\. Tried to allocate (?P<tried>[\d.]+) (?P<tunit>[GM]iB)\. GPU "
    r"(?P<gpu>\d+) has a total capacity of (?P<total>[\d.]+) GiB of which (?P<free>[\d.]+) "
    r"(?P<funit>[GM]iB) is free\. Process (?P<pid>\d+) has (?P<used>[\d.]+) (?P<unit>[GM]iB) "
    r"memory in use"
)


def _gib(value: str, unit: str) -> float:
    return _num(value) / (1024 if unit == "MiB" else 1)


def _orphans(holders: list[Holder]) -> tuple[str, dict[str, float]]:
    """The live orphaned server processes among ``holders``, in words and figures."""
    orphans = [h for h in holders if h.alive and h.orphan]
    if not orphans:
        return "", {}
    mib = [round((h.used_bytes or 0) / 2**20) for h in orphans]
    gpus = sorted({h.gpu for h in orphans if h.gpu is not None})
    numbers: dict[str, float] = {"orphans": len(orphans), "orphan_ppid": 1}
    for holder, each in zip(orphans, mib, strict=True):
        numbers[f"orphan_{holder.pid}_mib"] = each
    text = (
        f"; the node shows {len(orphans)} live server processes re-parented to PPID 1 "
        f"({', '.join(h.name for h in orphans[:4])}) holding {', '.join(map(str, mib))} MiB"
        + (f" on GPUs {', '.join(map(str, gpus))}" if gpus else "")
        + ", left over from an earlier launch"
    )
    return text, numbers


def gpu_held_at_oom(bundle: Bundle) -> Diagnosis | None:
    """PyTorch's OOM text names another process holding memory on the GPU (``Process N has X
    GiB memory in use``, §6): the launch could not get memory a live process already held."""
    hit = bundle.log.first(OOM_WITH_HOLDER)
    if hit is None:
        return None
    match = hit[1]
    gpu, pid, total = int(match["gpu"]), int(match["pid"]), _num(match["total"])
    used, free = _gib(match["used"], match["unit"]), _gib(match["free"], match["funit"])
    tried = _gib(match["tried"], match["tunit"])
    numbers: dict[str, float] = {
        "gpu": gpu,
        "holder_pid": pid,
        "held_gib": round(used, 2),
        "free_gib": round(free, 2),
        "gpu_total_gib": total,
        "tried_to_allocate_gib": round(tried, 2),
    }
    begin, end = bundle.log.first(LOAD_BEGIN), bundle.log.first(LOAD_END)
    when = " while loading the weights" if begin and (end is None or end[0] > hit[0]) else ""
    holders = _gpu_holders(bundle)
    orphans, figures = _orphans(holders)
    numbers.update(figures)
    evidence = [bundle.evidence(hit)]
    for h in holders[:4]:
        fact = f"PID {h.pid} ({h.name}) PPID {h.ppid} state {h.state} on GPU {h.gpu}"
        evidence.append(Evidence(fact, None, "snapshot"))
    if orphans:
        remedy = (
            "kill orphaned sglang::scheduler processes (kill -TERM, after 10 s kill -KILL: "
            f"PIDs {', '.join(str(h.pid) for h in holders if h.orphan)}) and verify nvidia-smi "
            "compute apps empty before relaunching; add a pre-launch GPU idle check, and launch "
            "each server in its own session so cleanup can kill by process group/session (under "
            "Slurm, let the job's cgroup / KillMode take the whole tree)"
        )
    else:
        remedy = (
            f"stop the process holding GPU {gpu} (PID {pid}) or launch on idle GPUs "
            "(CUDA_VISIBLE_DEVICES); add a pre-launch GPU idle check (nvidia-smi "
            "--query-compute-apps=pid,used_memory must be empty)"
        )
    return Diagnosis(
        category="gpu-occupied-by-other-process",
        secondary_categories=["defunct-zombie-process"] if orphans else [],
        summary=(
            f"GPU {gpu} is occupied by another process: PID {pid} holds {used:.2f} GiB of its "
            f"{total:.2f} GiB, so only {free:.2f} GiB was free and this launch ran out of memory"
            f"{when} (allocating {tried:.2f} GiB){orphans}"
        ),
        remedy=remedy,
        evidence=evidence,
        numbers=numbers,
    )


SMI_ROW = re.compile(
    r"(?:^\|\s*(?P<gpu>\d+)\s[^|]*)?\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|\s*"
    r"(?P<util>\d+)%"
)
COMPUTE_APP = re.compile(r"^\s*(?P<pid>\d+), (?P<used>\d+) MiB\s*$")
FUSER = re.compile(
    r"/dev/nvidia(?P<gpu>\d+):\s+(?P<user>\S+)\s+(?P<pid>\d+)\s+\S+\s+(?P<command>\S+)"
)
NO_PROCESSES = re.compile(r"No running processes found")
NO_SUCH_PROCESS = re.compile(r"\(?(?P<pid>\d+)\)? - No such process")
NSPID = re.compile(r"NSpid:\s+(?P<host>\d+)\s+(?P<inner>\d+)")
CONTAINER = re.compile(r"docker-(?P<id>[0-9a-f]{12})[0-9a-f]*\.scope")


def gpu_held_hidden(bundle: Bundle) -> Diagnosis | None:
    """nvidia-smi output in the log shows GPU memory in use and a live process holds it (the
    snapshot's ``ps``, or ``fuser -v /dev/nvidiaN``): occupied, not leaked (FORMAT.md). From
    inside a container nvidia-smi cannot name a host PID ("No running processes found") and
    ``kill`` answers "No such process": the holder is in another PID namespace."""
    shown = bundle.log.find(SMI_ROW) + bundle.log.find(COMPUTE_APP)
    fuser = bundle.log.first(FUSER)
    live = [h for h in _gpu_holders(bundle) if h.alive and h.gpu is not None]
    if not shown or not (live or fuser):
        return None
    if live:
        holder = live[0]
        pid, gpu, command = holder.pid, holder.gpu, holder.name
        mib = round(holder.used_bytes / 2**20) if holder.used_bytes else None
    else:
        assert fuser is not None
        pid, gpu, command = int(fuser[1]["pid"]), int(fuser[1]["gpu"]), fuser[1]["command"]
        mib = None
    rows = [m for _, m in bundle.log.find(SMI_ROW) if m["gpu"] is None or int(m["gpu"]) == gpu]
    numbers: dict[str, float] = {"gpu_index": int(gpu or 0), "holder_pid": pid}
    if mib is None and rows:
        mib = int(rows[0]["used"])
    if mib is not None:
        numbers["held_mib"] = mib
    util = ""
    if rows:
        numbers["util_percent"] = int(rows[0]["util"])
        util = f" at {rows[0]['util']}% util"
    summary = (
        f"GPU {gpu} is occupied by a live process: PID {pid} ({command or '?'}) holds "
        f"{mib if mib is not None else '?'} MiB{util}"
    )
    hidden = bundle.log.first(NO_PROCESSES) or bundle.log.first(NO_SUCH_PROCESS)
    nspid, container = bundle.log.first(NSPID), bundle.log.first(CONTAINER)
    evidence = [bundle.evidence(shown[0])]
    if hidden is not None:
        summary += (
            "; inside the launch container nvidia-smi lists no running process and kill answers "
            "'No such process', because the holder lives in another PID namespace"
        )
        evidence.append(bundle.evidence(hidden))
    if nspid is not None:
        summary += f" (PID {nspid[1]['inner']} there)"
    stop = ""
    if container is not None:
        summary += f", in Docker container {container[1]['id']}"
        stop = f"docker stop {container[1]['id']} (the container that owns it), or "
        evidence.append(bundle.evidence(container))
    if fuser is not None:
        summary += f"; fuser on /dev/nvidia{fuser[1]['gpu']} shows it (user {fuser[1]['user']})"
        evidence.append(bundle.evidence(fuser))
    return Diagnosis(
        category="gpu-occupied-by-other-process",
        summary=summary,
        remedy=(
            "run cleanup on the host as root: fuser -v /dev/nvidia* (or lsof /dev/nvidia*) names "
            f"the holders; {stop}kill the host PID from the host (kill -TERM {pid}, then -KILL), "
            "then check that the memory is free; do the pre-launch GPU idle check from the host"
        ),
        evidence=evidence,
        numbers=numbers,
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
        if str(tp).isdigit():
            numbers["tensor_parallel_size"] = int(str(tp))
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


# --- after the server was ready ------------------------------------------------------------------

# SGLang's ready line (§5) and vLLM's (uvicorn's) end of start-up.
SERVED = re.compile(r"The server is fired up and ready to roll!|Application startup complete\.")
NCCL_WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), "
    r"OpType=(?P<op>\w+).*?Timeout\(ms\)=(?P<timeout>\d+)\) ran for (?P<ran>\d+) milliseconds"
)
RANK_GONE = re.compile(
    r"Rank (?P<rank>\d+) scheduler (?:is dead|died)|(?P<title>sglang::scheduler\S*) \(PID "
    r"(?P<pid>\d+)\) died while serving"
)
# What the panel itself saw (its notes in the failure snapshot, ``panel: …``).
HEALTH_FAILED = re.compile(r"health check failed (?P<times>\d+) times in a row: (?P<why>.+)")


def served_then_failed(bundle: Bundle) -> Diagnosis | None:
    """The server reached ready, then stopped serving: a NCCL collective timed out (the
    watchdog aborts every rank), a TP rank died (SGLang ≤ 0.5.9 has no liveness watchdog, so
    the HTTP server keeps answering while ``/health`` says 503, §4–5), or ``/health`` kept
    failing. Memory causes (host pools pinned, a cgroup limit) are earlier rules."""
    ready = bundle.log.first(SERVED)
    if ready is None:
        return None
    after = [(n, m) for n, m in bundle.log.find(NCCL_WATCHDOG) if n > ready[0]]
    gone = [(n, m) for n, m in bundle.log.find(RANK_GONE) if n > ready[0]]
    notes = bundle.notes()
    died = next((m for m in map(RANK_GONE.search, notes) if m and m["title"]), None)
    health = next((m for m in map(HEALTH_FAILED.search, notes) if m), None)
    if not (after or gone or died or health):
        return None
    evidence = [bundle.evidence(ready)]
    numbers: dict[str, float] = {"tp_size": bundle.tp(), "ready_line": ready[0]}
    if after:
        hit = after[0]
        ran_s, timeout_s = int(hit[1]["ran"]) / 1000, int(hit[1]["timeout"]) / 1000
        numbers.update(nccl_timeout_s=timeout_s, nccl_ran_s=round(ran_s, 1))
        evidence.append(bundle.evidence(hit))
        summary = (
            f"the server was ready (line {ready[0]}), then a NCCL {hit[1]['op']} collective "
            f"(SeqNum {hit[1]['seq']}) ran {ran_s:.0f} s past its {timeout_s:.0f} s timeout "
            "and the watchdog aborted the ranks: one rank stalled or the GPU interconnect failed"
        )
        remedy = (
            "restart the launch; look for the stalled rank or a failing link (dmesg for Xid "
            "errors, nvidia-smi -q for ECC/NVLink errors, NCCL_DEBUG=INFO), and raise "
            "--dist-timeout only if a rank is legitimately slow"
        )
    else:
        what, kills = "", _oom_kills(bundle)
        if died is not None:
            what = f"{died['title']} (PID {died['pid']}) died while serving"
            numbers["dead_pid"] = int(died["pid"])
            evidence.append(Evidence(died.group(0), None, "snapshot"))
        elif gone:
            what = f"TP rank {gone[0][1]['rank']} died while serving"
            evidence.append(bundle.evidence(gone[0]))
        if kills:
            what = (what or "a rank was killed") + " — the kernel's OOM killer (host RAM)"
            evidence += kills[:2]
        if health is not None:
            numbers["health_failures"] = int(health["times"])
            evidence.append(Evidence(health.group(0), None, "snapshot"))
            answered = f"/health failed {health['times']} times in a row ({health['why']})"
            what = f"{what}; {answered}" if what else answered
        summary = f"the server was ready (line {ready[0]}), then stopped serving: {what}"
        if died is not None or gone:
            summary += "; the HTTP server may still answer while the dead rank's work never ends"
        remedy = (
            "restart the launch (stop it first so every rank's memory comes back); if the "
            "kernel OOM-killed the rank, give the node more free host RAM or a smaller host pool "
            "(--hicache-size); otherwise find who killed it (dmesg, an operator, the scheduler of "
            "the cluster) and, for a stuck scheduler, take a py-spy dump before stopping"
        )
    return Diagnosis(
        category="health-check-failure",
        summary=summary,
        remedy=remedy,
        evidence=evidence,
        numbers=numbers,
    )


def _oom_kills(bundle: Bundle) -> list[Evidence]:
    return [
        Evidence(str(line)[:300], None, "snapshot")
        for s in bundle.snapshots()
        for line in s.get("kernel_log") or []
        if NODE_OOM_KILL.search(str(line))
    ]


RULES: Sequence[Rule] = (
    kv_cache_too_small,
    vllm_gpu_occupied,
    model_not_found,
    leaked_after_cleanup,
    mem_fraction_window,
    gpu_oom_cuda_graph,
    gpu_held_at_oom,
    health_check_failure,
    startup_timeout,
    nccl_init_hang,
    nccl_shm,
    trust_remote_code,
    tp_divisibility,
    tp_gpu_mapping,
    host_precheck,
    mem_fraction_too_low,
    gpu_unbalanced,
    port_in_use,
    port_bind_in_use,
    host_oom_cgroup,
    host_oom_hicache,
    host_oom_pinned,
    served_then_failed,
    gpu_held_hidden,
)


# facts.json's shape (tests/fixtures/cases/FORMAT.md), for _clean.
RECORD_LISTS = {"snapshots", "gpus", "processes", "gpu_processes", "listening_ports", "interfaces"}
TEXT_LISTS = {"notes", "kernel_log", "command"}
OBJECTS = {"node", "env", "exit", "meminfo", "cgroup_memory", "shm", "network", "files"}
OPAQUE = {"model_config", "extra"}
NUMBERS = {
    *("host_ram_bytes", "memory_total_bytes", "memory_used_bytes", "used_memory_bytes"),
    *("max_bytes", "current_bytes", "size_bytes", "used_bytes", "model_weights_bytes"),
    *("MemTotal", "MemAvailable", "HugePages_Total", "HugePages_Free", "Hugepagesize"),
    *("pid", "ppid", "gpu_index", "index", "port", "elapsed_s", "nodes_in_launch", "code"),
}
TEXTS = {"state", "name", "cmdline", "phase", "ipv4", "uuid", "taken_at", "signal"}


def _clean(value: Any, key: str = "") -> Any:
    """``facts`` in the shape the rules read: a wrong-typed or ``None`` entry becomes absent
    (``None``, ``{}``, ``[]``), so no rule has to guard against it."""
    if key in NUMBERS:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return value if ok and math.isfinite(value) else None
    if key in TEXTS:
        return value if isinstance(value, str) else None
    if key in RECORD_LISTS:
        items = value if isinstance(value, list) else []
        return [_clean(item, "*") for item in items if isinstance(item, Mapping)]
    if key in TEXT_LISTS:
        items = value if isinstance(value, list) else []
        return [str(item) for item in items if item is not None]
    if key in OPAQUE:
        return dict(value) if isinstance(value, Mapping) else None
    if key == "env":
        pairs = value if isinstance(value, Mapping) else {}
        return {str(k): str(v) for k, v in pairs.items() if v is not None}
    if isinstance(value, Mapping):
        return {str(k): _clean(v, str(k)) for k, v in value.items()}
    if key in OBJECTS or key == "*":
        return {}
    return value


def diagnose(log_text: str, facts: Mapping[str, Any], flags: Mapping[str, Any]) -> Diagnosis:
    """The diagnosis of one bundle. ``flags`` are the command's values by dest, as the node's
    SGLang version parses them (``sglang_flags.parse_command(...).values``); never raises."""
    bundle = Bundle(
        Log(log_text if isinstance(log_text, str) else ""),
        _clean(facts if isinstance(facts, Mapping) else {}),
        dict(flags) if isinstance(flags, Mapping) else {},
    )
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
