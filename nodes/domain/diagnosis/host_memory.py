"""Rules for host memory running out: SGLang's own precheck, the pinned HiCache pools beyond the
node's RAM (at start-up or later), a container's cgroup limit."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from nodes.domain.diagnosis.evidence import (
    SHARDS,
    Bundle,
    Diagnosis,
    Evidence,
    GiB,
    Hit,
    Rule,
    _fmt,
    _num,
)
from nodes.domain.diagnosis.host_pools import (
    HOST_RESERVE_GB,
    HostPools,
    Neighbour,
    _available_before,
    _host_pool_source,
    _host_pools,
    _host_share,
    neighbours,
    said,
)

PRECHECK = re.compile(
    r"Not enough host memory available\. Requesting (?P<requested>[\d.]+) GB but only have "
    r"(?P<free>[\d.]+) GB free"
)


def host_precheck(bundle: Bundle) -> Diagnosis | None:
    """SGLang's own host-memory check refused the HiCache pool (§2, §6). It compares the pool
    with MemAvailable less a 10 GiB reserve; versions before sglang#8102 print MemAvailable as
    "free", later ones the figure after the reserve. Which one a message printed is read from
    MemAvailable before the launch when the bundle has it, else from the message itself (a
    request below the printed figure can only have been refused by the hidden reserve)."""
    hit = bundle.log.first(PRECHECK)
    if hit is None:
        return None
    requested, free = _num(hit[1]["requested"]), _num(hit[1]["free"])
    reserve = round(HOST_RESERVE_GB, 2)
    available = _available_before(bundle)
    if available is not None:
        before_reserve = abs(available - free) < abs(available - HOST_RESERVE_GB - free)
    elif (printed := _precheck_prints_before_reserve(bundle)) is not None:
        before_reserve = printed
    else:
        before_reserve = True  # the older wording, unless the message itself says otherwise
    if requested <= free:
        before_reserve = True  # a request under the printed figure: only the reserve refuses it
    usable = free - HOST_RESERVE_GB if before_reserve else free
    short = requested - usable
    ranks = bundle.local_ranks()
    # Every rank on the node pins its own pool out of the same free memory.
    per_rank = max(math.floor(usable / ranks), 0)
    numbers = {
        "requested_gb": requested,
        "reported_free_gb": free,
        "reserve_gb": reserve,
        "effective_free_gb": round(usable, 2),
        "shortfall_gb": round(short, 2),
        "suggested_hicache_size_gb": per_rank,
    }
    shared = (
        f"{per_rank} GB per rank here: {_fmt(round(max(usable, 0), 2))} GB usable shared by "
        f"the {ranks} ranks on this node"
        if ranks > 1
        else f"{per_rank} GB here"
    )
    others = neighbours(bundle)
    beside = elsewhere = ""
    if others:
        numbers["other_launches_gb"] = round(sum(n.gb for n in others), 2)
        beside = f", beside {said(others)} committed by the other launches on the node"
        names = ", ".join(n.label for n in others)
        elsewhere = f"; or start it on another node, or once {names} ended"
    if before_reserve:
        counted = (
            f"{_fmt(free)} GB free minus SGLang's fixed 10 GiB ({_fmt(reserve)} GB) reserve = "
            f"{_fmt(usable)} GB usable"
        )
    else:
        counted = f"{_fmt(free)} GB usable after SGLang's fixed 10 GiB ({_fmt(reserve)} GB) reserve"
        if available is not None:
            numbers["mem_available_gb"] = round(available, 2)
            counted += f" (MemAvailable {available:.2f} GB - {_fmt(reserve)} GB)"
    hugepages = _free_hugepages_gib(bundle)
    unseen = fix = ""
    if hugepages:
        numbers["hugepages_free_gib"] = hugepages
        unseen = (
            f"; {hugepages:.2f} GiB of reserved HugePages are free (HugePages_Free) and "
            "MemAvailable excludes reserved hugepages, so a pool backed by them is refused "
            "though it would fit"
        )
        fix = "; or shrink vm.nr_hugepages so the check sees the memory"
    return Diagnosis(
        category="host-mem-precheck",
        secondary_categories=["host-oom-hicache"],
        summary=(
            f"host RAM precheck failed: hicache {_fmt(requested)} GB requested, {counted} (short "
            f"by {_fmt(short)} GB){beside}{unseen}"
        ),
        remedy=(
            f"reduce --hicache-size so that the ranks' pools together fit MemAvailable - "
            f"{_fmt(reserve)} GB ({shared}; the 10 GiB reserve is SGLang's own), or free host "
            f"memory before launching{elsewhere}{fix}"
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


def _precheck_prints_before_reserve(bundle: Bundle) -> bool | None:
    """Whether this SGLang version's precheck message prints MemAvailable before the 10 GiB
    reserve (0.4.10.post2–0.5.18) or the share after it (0.5.19+, per rank: shared/reference
    sglang.md §2); ``None`` when the version is unknown."""
    try:
        version = Version(str(bundle.facts.get("engine_version") or ""))
    except InvalidVersion:
        return None
    return version < Version("0.5.19")


def _host_larger_than_device(bundle: Bundle) -> str:
    """What a smaller host pool also needs where SGLang asserts that it holds more tokens than
    the device pool (up to 0.5.12: shared/reference/sglang.md §1d); ``""`` from 0.5.13, or
    where the version is not known."""
    try:
        version = Version(str(bundle.facts.get("engine_version") or ""))
    except InvalidVersion:
        return ""
    if version >= Version("0.5.13"):
        return ""
    return (
        f"; SGLang {version} also needs each rank's host pool to hold more tokens than its "
        "device pool, so a smaller --hicache-size can need a lower --mem-fraction-static with it"
    )


def _free_hugepages_gib(bundle: Bundle) -> float | None:
    """Free reserved hugepages before the launch, GiB (meminfo HugePages_Free × Hugepagesize)."""
    for snapshot in bundle.snapshots():
        meminfo = snapshot.get("meminfo") or {}
        pages, size = meminfo.get("HugePages_Free"), meminfo.get("Hugepagesize")
        if isinstance(pages, int) and isinstance(size, int) and pages > 0 and size > 0:
            return round(pages * size / GiB, 2)
    return None


@dataclass(frozen=True)
class PoolsOverHost:
    """The host pools of the ranks on this node (GB) over the memory they come out of:
    ``limit`` is MemAvailable before the launch (``before``) when known, else the host RAM
    (``ram``); ``fits`` the --hicache-size per rank that would have fitted (SGLang's reserve
    kept back), ``meant`` the per-rank share of a size meant for the whole node."""

    pools: HostPools
    ram: float | None
    before: float | None
    limit: float
    tp: int
    fits: int
    meant: int
    others: tuple[Neighbour, ...] = ()

    @property
    def others_gb(self) -> float:
        return round(sum(n.gb for n in self.others), 2)


def _pools_over_host(bundle: Bundle) -> PoolsOverHost | None:
    found = _host_pools(bundle)
    if found is None:
        return None
    ram, before = bundle.host_ram_gb(), _available_before(bundle)
    limit = before if before is not None else ram
    others = tuple(neighbours(bundle))
    beside = sum(n.gb for n in others)
    if others and ram is not None and found.total <= (limit or ram) < found.total + beside:
        # Each launch fitted alone; together the node's pools exceed what it has.
        limit, before = ram, None
    elif limit is None or found.total <= limit:
        return None
    else:
        others, beside = (), 0.0
    ranks, first = found.ranks, found.pools[0]
    return PoolsOverHost(
        found,
        ram,
        before,
        limit,
        tp=bundle.tp()
        if bundle.vllm
        else bundle.count("tp_size", "tensor_parallel_size", default=ranks),
        fits=math.floor((limit - HOST_RESERVE_GB - beside) / ranks - (found.each - first)),
        meant=math.floor(first / ranks),
        others=others,
    )


def host_oom_hicache(bundle: Bundle) -> Diagnosis | None:
    """The host pools SGLang says it pins, summed over the ranks on this node, exceed the
    node's memory: each rank checked alone (≤ 0.5.18), so none refused (§2, §6)."""
    found = _pools_over_host(bundle)
    return None if found is None else _pools_over_host_diagnosis(bundle, found)


def _pools_over_host_diagnosis(bundle: Bundle, found: PoolsOverHost) -> Diagnosis:
    pools = found.pools
    evidence = [bundle.evidence(hit) for hit in pools.hits[: pools.ranks * len(pools.pools)]]
    for snapshot in bundle.facts.get("snapshots") or []:
        for line in (snapshot.get("kernel_log") or [])[:3]:
            evidence.append(Evidence(str(line)[:300], None, "snapshot"))
    if found.others:
        return _beside_others_diagnosis(found, evidence)
    return Diagnosis(
        category="host-oom-hicache",
        summary=_pools_over_host_summary(found),
        remedy=(
            f"--hicache-size is per rank (the aggregate across local ranks is what the node "
            f"must hold): reduce --hicache-size to at most {max(found.fits, 0)} GB per rank "
            f"here; if {_fmt(pools.pools[0])} GB was meant for the whole node, that is "
            f"--hicache-size {found.meant}{_host_larger_than_device(bundle)}"
        ),
        evidence=evidence,
        numbers=_pools_over_host_numbers(found),
    )


def _beside_others_diagnosis(found: PoolsOverHost, evidence: list[Evidence]) -> Diagnosis:
    """Host pools that fitted alone but not beside the other launches' on the node."""
    pools, others = found.pools, said(list(found.others))
    total = round(pools.total + found.others_gb, 2)
    fits = (
        f"beside them this launch fits with --hicache-size at most {found.fits} GB per rank"
        if found.fits > 0
        else "no --hicache-size fits beside them"
    )
    return Diagnosis(
        category="host-oom-hicache",
        summary=(
            f"host RAM exhausted by the host pools of the launches on this node together: this "
            f"one's {pools.ranks} ranks x {_fmt(pools.each)} GB = {_fmt(pools.total)} GB + "
            f"{others} = {_fmt(total)} GB > {_fmt(found.limit)} GB host RAM; each was checked "
            "alone against the memory available before it pinned"
        ),
        remedy=(
            f"the launches on a node share its host RAM: {fits} (--hicache-size is per rank); "
            f"or start it on another node, or once {', '.join(n.label for n in found.others)} "
            f"{'has' if len(found.others) == 1 else 'have'} ended"
        ),
        evidence=evidence,
        numbers={
            **_pools_over_host_numbers(found),
            "other_launches_gb": found.others_gb,
            "node_aggregate_gb": total,
        },
    )


def _pools_over_host_numbers(found: PoolsOverHost) -> dict[str, float]:
    pools = found.pools
    numbers = {
        "tp_size": found.tp,
        "local_ranks": pools.ranks,
        "hicache_size_gb_per_rank": pools.pools[0],
        "per_rank_total_gb": pools.each,
        "aggregate_gb": pools.total,
    }
    if len(pools.pools) > 1:
        numbers["dsa_indexer_gb_per_rank"] = pools.pools[1]
    if found.ram is not None:
        numbers["host_ram_gb"] = round(found.ram, 2)
        if found.before is not None:
            numbers["mem_available_before_gb"] = round(found.before, 2)
    if found.fits > 0:
        numbers["suggested_hicache_size_gb"] = found.fits
    return numbers


def _pools_over_host_summary(found: PoolsOverHost) -> str:
    pools = found.pools
    each, total = _fmt(pools.each), _fmt(pools.total)
    against = f"{_fmt(found.limit)} GB {'available' if found.before is not None else 'host RAM'}"
    if found.ram is not None and found.before is not None:
        against += f" ({_fmt(found.ram)} GB host RAM)"
    if len(pools.pools) > 1:
        parts = " + ".join(f"{_fmt(p)} GB" for p in pools.pools)
        return (
            f"host RAM exhausted: host pools {parts} = {each} GB per rank x {pools.ranks} local "
            f"ranks = {total} GB > {against}; SGLang checked each rank alone{_each_passed(found)}"
        )
    per = f"--hicache-size {each} GB is per TP rank; {pools.ranks} ranks"
    return f"host RAM exhausted: {per} x {each} GB = {total} GB > {against}{_each_passed(found)}"


def _each_passed(found: PoolsOverHost) -> str:
    """Why SGLang's own check let it through: each rank's pool fit what was available less the
    10 GiB reserve, checked before any rank had pinned (empty when it would not have)."""
    budget = found.limit - HOST_RESERVE_GB
    if found.before is None or found.pools.ranks < 2 or found.pools.each > budget:
        return ""
    return (
        f"; each rank's own check passed ({_fmt(found.pools.each)} <= {_fmt(found.limit)} - "
        f"{HOST_RESERVE_GB:.2f} = {budget:.2f} GB) because each checked before the others pinned"
    )


NODE_OOM_KILL = re.compile(r"Out of memory: Killed process (?P<pid>\d+)")
# The same in a person's words, in a note ("the kernel OOM killer killed the server").
PROSE_OOM_KILL = re.compile(
    r"(?i)\bOOM[- ]killer (?:killed|terminated)|\bkilled by the (?:kernel'?s? )?OOM[- ]killer|"
    r"\bOOM[- ]killed\b"
)


SHELL_KILLED = re.compile(r"^\S+: line \d+:\s+(?P<pid>\d+) Killed\s")


@dataclass(frozen=True)
class PinnedShare:
    """This server's share of the host memory (GB, and what it is), the part of it the host
    pools pin, and the GB per rank that keeps them under half of it (pinned memory is never
    reclaimed, §9 rule 1)."""

    budget: float
    what: str
    pinned_fraction: float
    suggested: int


@dataclass(frozen=True)
class PinnedKill:
    """Host pools that fitted at start-up, the kernel's later OOM kill (its lines), and the
    pools against this server's share of the host (``None``: the share is unknown)."""

    pools: HostPools
    kills: tuple[str, ...]
    tp: int
    share: PinnedShare | None


def _oom_kill_lines(bundle: Bundle) -> list[str]:
    """The snapshots' kernel log lines of the OOM killer (``Out of memory: Killed process``)."""
    return [
        line[:300]
        for line in bundle.kernel_lines()
        if NODE_OOM_KILL.search(line) or PROSE_OOM_KILL.search(line)
    ]


def _pinned_kill(bundle: Bundle) -> PinnedKill | None:
    pools = _host_pools(bundle)
    kills = _oom_kill_lines(bundle)
    if pools is None or not kills:
        return None
    share = _host_share(bundle) or (
        (before, "the memory available before the launch")
        if (before := _available_before(bundle)) is not None
        else None
    )
    pinned = None
    if share is not None:
        budget, what = share
        suggested = math.floor(0.5 * budget / pools.ranks)
        pinned = PinnedShare(budget, what, pools.total / budget, suggested)
    return PinnedKill(pools, tuple(kills), bundle.tp(), pinned)


def host_oom_pinned(bundle: Bundle) -> Diagnosis | None:
    """The host pools fit at start-up, but pinned (``cudaHostRegister``/``pin_memory``, §2) they
    cannot be reclaimed, and the kernel's OOM killer struck later: the pools' share of this
    server's host budget is what to show. Needs the kernel's ``Out of memory: Killed process``."""
    found = _pinned_kill(bundle)
    return None if found is None else _pinned_kill_diagnosis(bundle, found)


def _pinned_kill_diagnosis(bundle: Bundle, found: PinnedKill) -> Diagnosis:
    pools = found.pools
    source, numbers = _host_pool_source(bundle)
    numbers.update(
        tp_size=found.tp,
        hicache_gb_per_rank=pools.each,
        local_ranks=pools.ranks,
        hicache_gb_total=pools.total,
    )
    against, fits = "", ""
    if (share := found.share) is not None:
        numbers.update(host_budget_gb=round(share.budget, 2))
        numbers["fraction_of_budget_pinned"] = round(share.pinned_fraction, 2)
        numbers["suggested_hicache_size_gb"] = share.suggested
        against = f", {share.pinned_fraction:.2f} of {share.what} ({_fmt(share.budget)} GB)"
        fits = f"; --hicache-size {share.suggested} or less per rank keeps the pinned total "
        fits += "under half of the host budget share"
    evidence = [bundle.evidence(hit) for hit in pools.hits[: pools.ranks]]
    killed = bundle.log.first(SHELL_KILLED)
    if killed is not None:
        evidence.append(bundle.evidence(killed))
    kills = [Evidence(line, None, "snapshot") for line in found.kills[:2]]
    return Diagnosis(
        category="host-oom-hicache",
        summary=(
            f"host RAM exhausted after start-up: {source} = {pools.each:.2f} GB pinned per rank x "
            f"{pools.ranks} ranks (TP {found.tp}) = {pools.total:.2f} GB{against}; pinned pages "
            "cannot be reclaimed, so later load drove the node into the kernel OOM killer"
        ),
        remedy=(
            "size the host pool in absolute GB with --hicache-size (an absolute size per rank; "
            "--hicache-ratio is relative to the device KV pool, so a large device pool makes a "
            f"huge pinned host pool), or reduce --hicache-ratio{fits}"
        ),
        evidence=evidence + kills,
        numbers=numbers,
    )


# "OOMKilled" as a reason or a flag that is set; not "OOMKilled: false", "=0", "count: 0".
CGROUP_OOM = re.compile(
    r"Memory cgroup out of memory|OOMKilled(?![\"']?\s*(?:[:=]|count:?|is|was)\s*(?:false|0|no)\b)"
)


LOAD_NOTE = re.compile(r"(?P<tokens>\d[\d,]*)-token\b.*?\bconcurrency (?P<concurrency>\d+)")


NEW_SEQ = re.compile(r"#new-seq: (?P<seqs>\d+),.*?#running-req: (?P<running>\d+)")


@dataclass(frozen=True)
class CgroupUsage:
    """memory.current in bytes after start-up (``idle``: the first sample during the launch) and
    at its peak, against memory.max (``limit``); the load at the peak: a note's token count and
    concurrency (``load``), else the most requests the log shows at once (``concurrency``)."""

    limit: float
    idle: float
    peak: float
    load: re.Match[str] | None
    concurrency: int | None


@dataclass(frozen=True)
class CgroupOom:
    """A container's memory limit ran out: the signs (snapshot lines, cut to 300 characters, and
    log lines), memory.max in bytes and the usage against it when the snapshots say, the host
    pools inside it, and the GB per rank that keeps the observed peak under 80 % of the limit
    (``room``, only when positive)."""

    sign_lines: tuple[str, ...]
    sign_hits: tuple[Hit, ...]
    tp: int
    limit: float | None
    usage: CgroupUsage | None
    pools: HostPools | None
    room: int | None


def _cgroup_samples(
    bundle: Bundle,
) -> tuple[float | None, list[tuple[float, Mapping[str, Any]]]]:
    """memory.max of the last snapshot that has one (bytes), and (memory.current, snapshot) of
    every snapshot taken during the launch."""
    limit, samples = None, []
    for snapshot in bundle.snapshots():
        cgroup = snapshot.get("cgroup_memory") or {}
        if isinstance(cgroup.get("max_bytes"), int | float) and cgroup["max_bytes"] > 0:
            limit = cgroup["max_bytes"]
        if snapshot.get("phase") == "during" and isinstance(
            cgroup.get("current_bytes"), int | float
        ):
            samples.append((cgroup["current_bytes"], snapshot))
    return limit, samples


def _cgroup_usage(bundle: Bundle) -> tuple[float | None, CgroupUsage | None]:
    limit, samples = _cgroup_samples(bundle)
    if not samples or limit is None:
        return limit, None
    idle, peak = samples[0][0], max(samples, key=lambda s: s[0])
    # The first note of the peak's snapshot says the load, if any does.
    load = next((LOAD_NOTE.search(str(n)) for n in peak[1].get("notes") or []), None)
    seqs = [int(m["seqs"]) + int(m["running"]) for _, m in bundle.log.find(NEW_SEQ)]
    return limit, CgroupUsage(limit, idle, peak[0], load, max(seqs) if seqs else None)


def _cgroup_oom(bundle: Bundle) -> CgroupOom | None:
    lines = [text[:300] for text in bundle.kernel_lines() if CGROUP_OOM.search(text)]
    hits = bundle.log.find(CGROUP_OOM)
    if not (lines or hits):
        return None
    tp = bundle.tp()
    limit, usage = _cgroup_usage(bundle)
    pools = _host_pools(bundle)
    room = None
    if pools is not None and usage is not None:
        # What the pools may take so that the observed peak stays under 80 % of the limit.
        other = usage.idle / 1e9 - pools.total
        growth = (usage.peak - usage.idle) / 1e9
        room = math.floor((0.8 * usage.limit / 1e9 - other - growth) / pools.ranks)
    return CgroupOom(
        tuple(lines),
        tuple(hits),
        tp,
        limit,
        usage,
        pools,
        room if room is not None and room > 0 else None,
    )


def host_oom_cgroup(bundle: Bundle) -> Diagnosis | None:
    """A container's memory limit (cgroup ``memory.max``), not the node's RAM, ran out: the
    kernel's ``Memory cgroup out of memory`` or the runtime's ``OOMKilled``. HiCache pools are
    booked against the whole host's free memory up to 0.5.20 (§2), so they can fill a limit."""
    found = _cgroup_oom(bundle)
    return None if found is None else _cgroup_oom_diagnosis(bundle, found)


def _cgroup_oom_diagnosis(bundle: Bundle, found: CgroupOom) -> Diagnosis:
    numbers: dict[str, float] = {"tp_size": found.tp}
    parts = [f"container memory limit hit (TP {found.tp})"]
    if found.limit is not None:
        numbers["cgroup_limit_gib"] = round(found.limit / GiB, 2)
        parts[0] += f": cgroup memory.max is {found.limit / GiB:.0f} GiB"
    if found.usage is not None:
        numbers.update(_cgroup_usage_numbers(found.usage))
        parts.append(_cgroup_usage_text(found.usage))
    secondary, fits = [], ""
    if (pools := found.pools) is not None:
        secondary = ["host-oom-hicache"]
        source, figures = _host_pool_source(bundle)
        numbers.update(figures, hicache_gb_total=pools.total)
        parts.append(
            f"{pools.ranks} ranks pin {pools.ranks} x {pools.each:.2f} GB = {pools.total:.2f} GB "
            f"of HiCache host pools ({source}) inside it"
        )
    if found.room is not None:
        numbers["suggested_hicache_size_gb"] = found.room
        fits = f" ({found.room} GB per rank here keeps the observed peak under 80 % of the limit)"
    loaded = bundle.log.find(SHARDS)
    if loaded and found.pools is None:
        done, total = loaded[-1][1]["done"], loaded[-1][1]["total"]
        numbers.update(shards_loaded=int(done), shards_total=int(total))
        parts.append(f"killed while loading the weights ({done}/{total} checkpoint shards)")
    code = (bundle.facts.get("exit") or {}).get("code")
    if isinstance(code, int):
        numbers["exit_code"] = code
        parts.append(f"exit code {code}")
    signs = [Evidence(line, None, "snapshot") for line in found.sign_lines]
    signs += [bundle.evidence(hit) for hit in found.sign_hits]
    pool_lines = [bundle.evidence(h) for h in pools.hits[:2]] if pools else []
    return Diagnosis(
        category="host-oom-cgroup",
        secondary_categories=secondary,
        summary="; ".join(parts) + ", then the kernel OOM-killed the container's process",
        remedy=(
            (
                "size HiCache against the cgroup memory.max (the container limit not host RAM): "
                f"lower --hicache-ratio or set --hicache-size{fits}; or raise the container's "
                "memory limit, and keep headroom for runtime growth"
            )
            if found.pools is not None
            else (
                "raise the container memory limit (limits.memory; the container limit not node "
                "RAM is what ran out): size the limit for weight loading (page cache + per-worker "
                "staging), or load with fewer/lighter loader copies"
            )
        ),
        evidence=signs[:3] + pool_lines,
        numbers=numbers,
    )


def _cgroup_usage_numbers(usage: CgroupUsage) -> dict[str, float]:
    numbers: dict[str, float] = {
        "idle_usage_gib": round(usage.idle / GiB, 2),
        "idle_fraction_of_limit": round(usage.idle / usage.limit, 2),
        "peak_usage_gib": round(usage.peak / GiB, 2),
    }
    if usage.load is not None:
        numbers["load_tokens"] = int(usage.load["tokens"].replace(",", ""))
        numbers["concurrency"] = int(usage.load["concurrency"])
    elif usage.concurrency is not None:
        numbers["concurrency"] = usage.concurrency
    return numbers


def _cgroup_usage_text(usage: CgroupUsage) -> str:
    idle, limit, peak = usage.idle, usage.limit, usage.peak
    text = (
        f"memory.current was {idle / GiB:.0f} GiB after start-up ({idle / limit:.2f} of the "
        f"limit) and {peak / GiB:.0f} GiB at the peak"
    )
    if usage.load is not None:
        tokens = int(usage.load["tokens"].replace(",", ""))
        return text + f" (under a {tokens:g}-token load at concurrency {usage.load['concurrency']})"
    if usage.concurrency is not None:
        text += f" (under load, up to {usage.concurrency} requests at once)"
    return text


#: The line that alone shows each rule's failure, whatever its figures say (engine._unreadable).
RECOGNISES: dict[Rule, tuple[str, re.Pattern[str]]] = {
    host_precheck: ("host-mem-precheck", re.compile(r"Not enough host memory available")),
}
