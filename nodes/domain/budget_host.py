"""The pinned host memory of the ranks on one node against what the node can give them
(shared/reference/sglang.md §2, §1d, §9): the HiCache host pool per rank (``--hicache-size``
decimal GB per rank, rounded to whole tokens; or ``--hicache-ratio`` × the rank's device KV
pool; or sized by SGLang itself from 0.5.21), plus ``--cpu-offload-gb``, × the ranks on the
node, against the lowest of host RAM less the OS headroom, MemAvailable and the cgroup limit,
less SGLang's 10 GiB reserve. All sizes are bytes.

Each figure is a function returning it (``pool_by_size``, ``host_budget``, ``host_fix``,
``larger_host_fix``); the lines and messages that explain them are written into the
``BudgetReport`` by ``host_pool``'s steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from nodes.domain.budget_device import DevicePool
from nodes.domain.budget_types import BudgetReport, NodeMemory
from nodes.domain.sglang_flags import ParsedCommand
from nodes.domain.units import GB, GiB, format_bytes

SGLANG_HOST_RESERVE_BYTES = 10 * GiB  # §2: available − 10 GiB in every version
# Pinned (page-locked) memory cannot be reclaimed; a node with 57 % of its RAM pinned was
# OOM-killed under load (case C01). Above half of RAM we warn.
PINNED_SHARE_WARN = 0.5

# Where SGLang's behaviour changed (§2, §1d), compared as pip orders versions (PEP 440): "up to
# 0.5.18" is "before 0.5.19", so 0.5.18.post1 keeps 0.5.18's rules and 0.5.19rc0, which comes
# before 0.5.19, keeps them too.
V0_5_6 = Version("0.5.6")  # the host pool gets one token more (§2)
V0_5_13 = Version("0.5.13")  # no longer asserts host pool > device pool (§1d)
V0_5_19 = Version("0.5.19")  # checks host memory for all ranks on the host, not per rank (§2)
V0_5_21 = Version("0.5.21")  # sizes the host pool itself without --hicache-size/-ratio (§2)

#: --hicache-ratio's default: 2.0 in every version (0.5.18+ resolves its None to 2.0), §1d.
DEFAULT_HICACHE_RATIO = 2.0


@dataclass(frozen=True)
class HostSize:
    """One rank's HiCache host pool as SGLang sizes it: ``per_rank`` bytes (0 when SGLang sizes
    it itself at start) and its tokens (``None`` when unknown)."""

    per_rank: int
    tokens: int | None


def pool_by_size(size_gb: int, cell: int | None, vkey: Version) -> HostSize:
    """``--hicache-size`` GB (10^9 bytes) per rank: whole tokens of ``cell`` bytes, one token
    more from 0.5.6 (§2); the size itself when the bytes per token are unknown."""
    if not cell:
        return HostSize(size_gb * GB, None)
    tokens = size_gb * GB // cell + (0 if vkey < V0_5_6 else 1)
    return HostSize(tokens * cell, tokens)


def pool_by_ratio(tokens: int, kv_bytes: int, ratio: float) -> HostSize:
    """``--hicache-ratio`` × the rank's device KV pool (``tokens``, ``kv_bytes``), §1d."""
    return HostSize(int(kv_bytes * ratio), int(tokens * ratio))


@dataclass(frozen=True)
class Pinned:
    """What the ranks on the node pin: ``per_rank`` bytes (the HiCache pool with
    ``--cpu-offload-gb``, ``offload`` bytes) × ``ranks``; with ``--hicache-size`` (GB) as given."""

    ranks: int
    per_rank: int
    size_gb: int
    offload: int

    @property
    def per_node(self) -> int:
        return self.per_rank * self.ranks


@dataclass(frozen=True)
class HostBudget:
    """What the node lets the ranks pin: the lowest of its limits (``ram``: host RAM less the OS
    headroom, ``available``: MemAvailable now, ``cgroup``: the cgroup limit; those it knows, in
    that order) less SGLang's 10 GiB reserve, at least 0 (``allowed``)."""

    limits: tuple[tuple[str, int], ...]
    allowed: int


def host_budget(node: NodeMemory, os_headroom: int) -> HostBudget | None:
    """``None`` when the node says none of its limits. Other launches on the node count: host
    RAM less everything they committed, MemAvailable less what they committed and have not
    pinned yet (SGLang pins its host pool only after the weights, minutes after the start)."""
    committed = sum(n.host_bytes for n in node.neighbours)
    outstanding = sum(n.host_bytes for n in node.neighbours if not n.pinned)
    limits = []
    if node.host_ram_bytes:
        limits.append(("ram", node.host_ram_bytes - os_headroom - committed))
    if node.mem_available_bytes is not None:
        limits.append(("available", node.mem_available_bytes - outstanding))
    if node.cgroup_limit_bytes is not None:
        limits.append(("cgroup", node.cgroup_limit_bytes))
    if not limits:
        return None
    low = min(value for _, value in limits)
    return HostBudget(tuple(limits), max(0, low - SGLANG_HOST_RESERVE_BYTES))


def host_pool(
    flags: ParsedCommand,
    node: NodeMemory,
    device: DevicePool,
    ranks: int,
    report: BudgetReport,
    vkey: Version,
    os_headroom: int,
) -> None:
    """Check the pinned host memory of ``ranks`` ranks on ``node`` (SGLang ``vkey``), writing
    the arithmetic, the verdict and the fix into ``report``; never raises."""
    offload = int(flags.get("cpu_offload_gb", default=0) or 0) * GB
    hicache = bool(flags.get("enable_hierarchical_cache", default=False))
    if not hicache and not offload:
        _no_host_pool(flags, report)
        return
    size_gb = int(flags.get("hicache_size", default=0) or 0)
    pool = HostSize(0, None)
    if hicache:
        hicache_pool = _hicache_pool(flags, node, device, report, vkey, size_gb, os_headroom)
        if hicache_pool is None:
            return
        pool = hicache_pool
    pinned = Pinned(ranks, pool.per_rank + offload, size_gb, offload)
    _show_pinned(pinned, report)
    budget = host_budget(node, os_headroom)
    if budget is None:
        report.add("warn", "host_ram_unknown", "Host RAM unknown: discover the node to check")
        return
    _show_budget(budget, node, os_headroom, report)
    _judge(hicache, node, device, pinned, budget.allowed, report, vkey)


def _judge(
    hicache: bool,
    node: NodeMemory,
    device: DevicePool,
    pinned: Pinned,
    budget: int,
    report: BudgetReport,
    vkey: Version,
) -> None:
    """The verdict on what the ranks pin against the budget, with the fix, and the warnings of
    versions whose own check would not stop them."""
    if pinned.per_node > budget:
        _host_block(hicache, node, pinned, budget, report)
    elif node.host_ram_bytes and pinned.per_node > PINNED_SHARE_WARN * node.host_ram_bytes:
        report.add(
            "warn",
            "pinned_share",
            f"{pinned.per_node / node.host_ram_bytes:.0%} of host RAM would be pinned; pinned "
            "memory cannot be reclaimed, and growth under load has OOM-killed servers that "
            "fitted at start",
        )
    if hicache and vkey < V0_5_13:
        _fit_protocol(report, device, vkey, pinned.size_gb, budget // pinned.ranks)
    if hicache and pinned.ranks > 1 and vkey < V0_5_19:
        report.add(
            "warn",
            "per_rank_check",
            f"SGLang {vkey} checks host memory in each rank alone: its own "
            "check does not protect this node from the total above",
        )


def _no_host_pool(flags: ParsedCommand, report: BudgetReport) -> None:
    report.lines.append("No hierarchical cache: no host pool")
    if "hicache_size" in flags.given or "hicache_ratio" in flags.given:
        report.add(
            "warn",
            "hicache_ignored",
            "--hicache-size/--hicache-ratio do nothing without --enable-hierarchical-cache",
        )


def _hicache_pool(
    flags: ParsedCommand,
    node: NodeMemory,
    device: DevicePool,
    report: BudgetReport,
    vkey: Version,
    size_gb: int,
    os_headroom: int,
) -> HostSize | None:
    """One rank's HiCache pool as this version sizes it; ``None`` (warned) when it comes from a
    device pool that is unknown."""
    if size_gb > 0:
        pool = pool_by_size(size_gb, device.cell, vkey)
        report.lines.append(
            f"Host pool per rank: --hicache-size {size_gb} = {size_gb} GB (10^9 bytes) per "
            f"rank → {format_bytes(pool.per_rank, 'GB', places=2)}"
        )
    elif vkey >= V0_5_21 and "hicache_ratio" not in flags.given:
        _autosize(node, report, os_headroom)
        pool = HostSize(0, None)
    else:
        ratio_pool = _ratio_pool(flags, device, report)
        if ratio_pool is None:
            return None
        pool = ratio_pool
    if (
        vkey < V0_5_13
        and pool.tokens is not None
        and device.tokens
        and pool.tokens <= device.tokens
    ):
        report.add(
            "block",
            "host_not_larger",
            f"SGLang {vkey} requires the host pool to hold more tokens "
            f"than the device pool ({pool.tokens:,} ≤ {device.tokens:,}); it asserts at start",
        )
    return pool


def _autosize(node: NodeMemory, report: BudgetReport, os_headroom: int) -> None:
    """SGLang 0.5.21+ sizes the pool itself, and refuses to start with nothing left after its
    reserve."""
    budget = host_budget(node, os_headroom)
    if budget is not None and budget.allowed <= 0:
        report.add(
            "block",
            "host_oom",
            "No host memory is left for HiCache after SGLang's 10 GiB reserve: SGLang "
            "0.5.21+ refuses to start (give --hicache-size explicitly, or free memory)",
        )
    report.add(
        "info",
        "hicache_autosize",
        "SGLang 0.5.21+ sizes the host pool itself when neither --hicache-size nor "
        "--hicache-ratio is given: 0.8 × (available − 10 GiB) ÷ ranks on the node, at most "
        "ratio 2.0.",
    )


def _ratio_pool(flags: ParsedCommand, device: DevicePool, report: BudgetReport) -> HostSize | None:
    given = flags.get("hicache_ratio")
    ratio = float(given) if given is not None else DEFAULT_HICACHE_RATIO
    if device.kv_bytes is None or device.tokens is None:
        report.add(
            "warn",
            "host_unknown",
            f"--hicache-ratio {ratio} sizes the host pool from the device pool, which is "
            "unknown without the model's geometry: the host footprint cannot be checked",
        )
        return None
    pool = pool_by_ratio(device.tokens, device.kv_bytes, ratio)
    report.lines.append(
        f"Host pool per rank: ratio {ratio} × {format_bytes(device.kv_bytes, 'GB', places=2)} "
        f"device KV = {format_bytes(pool.per_rank, 'GB', places=2)}"
    )
    return pool


def _show_pinned(pinned: Pinned, report: BudgetReport) -> None:
    if pinned.offload:
        report.lines.append(f"  + --cpu-offload-gb: {format_bytes(pinned.offload, 'GB')} per rank")
    report.host_pool_bytes_per_rank = pinned.per_rank
    report.host_pool_bytes_per_node = pinned.per_node
    report.lines.append(
        f"Host pools on the node: {format_bytes(pinned.per_rank, 'GB', places=2)} × "
        f"{pinned.ranks} ranks = {format_bytes(pinned.per_node, 'GB', places=2)} pinned"
    )


def _show_budget(
    budget: HostBudget, node: NodeMemory, os_headroom: int, report: BudgetReport
) -> None:
    names = {"available": "MemAvailable now", "cgroup": "cgroup limit"}
    if node.own_pinned_bytes and node.mem_available_bytes is not None:
        read = format_bytes(node.mem_available_bytes - node.own_pinned_bytes, "GB", places=2)
        own = format_bytes(node.own_pinned_bytes, "GB", places=2)
        names["available"] = (
            f"MemAvailable now {read} + {own} pinned by {node.given_back_by} (theirs to "
            "give back when they stop) ="
        )
    if node.host_ram_bytes:
        ram, spare = format_bytes(node.host_ram_bytes, "GB"), format_bytes(os_headroom, "GB", 2)
        names["ram"] = f"host RAM {ram} − {spare} for the OS ="
    if node.neighbours:
        _show_neighbours(node, names, report)
    shown = ", ".join(
        f"{names[kind]} {format_bytes(value, 'GB', places=2)}" for kind, value in budget.limits
    )
    total = format_bytes(budget.allowed, "GB", places=2)
    report.lines.append(f"Host budget: min({shown}) − SGLang's 10 GiB reserve = {total}")
    report.host_budget_bytes = budget.allowed


def _show_neighbours(node: NodeMemory, names: dict[str, str], report: BudgetReport) -> None:
    """The other launches' commitments, each named, and what they take from each limit."""
    for n in node.neighbours:
        state = "pinned" if n.pinned else "committed, not yet pinned"
        report.lines.append(
            f"Launch {n.label} on this node: {format_bytes(n.host_bytes, 'GB', places=2)} of "
            f"host memory ({state})"
        )
    committed = format_bytes(sum(n.host_bytes for n in node.neighbours), "GB", places=2)
    waiting = [n for n in node.neighbours if not n.pinned]
    if "ram" in names:
        names["ram"] = f"{names['ram'].removesuffix(' =')} − {committed} committed by others ="
    if waiting and node.mem_available_bytes is not None:
        now = format_bytes(node.mem_available_bytes, "GB", places=2)
        others = " − ".join(
            f"{format_bytes(n.host_bytes, 'GB', places=2)} for launch {n.label}" for n in waiting
        )
        names["available"] = f"MemAvailable now {now} − {others}, not yet pinned ="


@dataclass(frozen=True)
class HostFix:
    """GB per rank that fit a budget the ranks exceed: the largest --hicache-size beside the
    offload (``largest``), the largest --cpu-offload-gb alone (``offload_gb``), and the per-rank
    share of a --hicache-size that reads as a node total (``meant``; ``None``: it does not)."""

    largest: int
    offload_gb: int
    meant: int | None


def host_fix(pinned: Pinned, budget: int) -> HostFix:
    """``HostFix`` for what the ranks pin against ``budget`` bytes."""
    largest = max(0, (budget // pinned.ranks - pinned.offload) // GB)
    offload_gb = max(0, budget // pinned.ranks // GB)
    meant = None
    if pinned.size_gb:
        share = pinned.size_gb // pinned.ranks
        # Only a size far beyond the node reads as a node total typed as a per-rank value.
        if share <= largest and pinned.per_node > 2 * budget:
            meant = share
    return HostFix(largest, offload_gb, meant)


def _beside(node: NodeMemory) -> str:
    if not node.neighbours:
        return ""
    return " beside " + ", ".join(
        f"launch {n.label} ({format_bytes(n.host_bytes, 'GB', places=2)})" for n in node.neighbours
    )


def _host_block(
    hicache: bool, node: NodeMemory, pinned: Pinned, budget: int, report: BudgetReport
) -> None:
    """Block: the ranks together pin more than the budget; suggest the largest size that fits."""
    ram = f" of a {format_bytes(node.host_ram_bytes, 'GB')} node" if node.host_ram_bytes else ""
    report.add(
        "block",
        "host_oom",
        f"{pinned.ranks} × {format_bytes(pinned.per_rank, 'GB', places=2)} = "
        f"{format_bytes(pinned.per_node, 'GB', places=2)} of pinned host memory against a "
        f"budget of {format_bytes(budget, 'GB', places=2)}{ram}{_beside(node)}: the ranks "
        "together would exhaust the node and the kernel would OOM-kill them",
    )
    fix = host_fix(pinned, budget)
    if not hicache:
        text = f"The largest --cpu-offload-gb that fits is {fix.offload_gb} (GB per rank)."
        report.add("info", "host_fix", text)
        report.suggestion = {"--cpu-offload-gb": fix.offload_gb}
        return
    # Sizes, not changes: the change is said once it has passed the whole check (budget.py).
    text = f"At most {fix.largest} GB per rank fits the host budget."
    suggestion: dict[str, Any] = {"--hicache-size": fix.largest}
    if fix.largest < 1:
        # --hicache-size 0 means "size it by --hicache-ratio" (§1d), not "none": without a
        # host pool that fits, the change is to run without HiCache.
        text = "No host pool fits the host budget: run without the hierarchical cache."
        suggestion = {"--enable-hierarchical-cache": None, "--hicache-size": None}
    elif fix.meant is not None:
        suggestion = {"--hicache-size": fix.meant}
        text = (
            f"If {pinned.size_gb} GB was meant for the whole node, that is {fix.meant} GB per "
            f"rank ({pinned.size_gb} GB ÷ {pinned.ranks} ranks). " + text
        )
    report.add("info", "host_fix", text)
    report.suggestion = suggestion


#: How much more the suggested host pool holds than the device pool, where SGLang asserts that
#: it holds more: the device pool here is an estimate (weights per rank from the checkpoint are
#: a few percent off SGLang's own figure, kv-observations.json), and a size at the boundary
#: would assert at start on that error.
HOST_OVER_DEVICE_MARGIN = 0.05


@dataclass(frozen=True)
class LargerHostFix:
    """Up to 0.5.12 the host pool must hold more tokens than the device pool (§1d): the smallest
    --hicache-size that does (``minimum``, GB); when that does not fit the host, the size
    ``wanted`` with the mem-fraction-static that shrinks the device pool below it (``mfs``)."""

    minimum: int
    wanted: int
    mfs: float | None


def larger_host_fix(device: DevicePool, wanted: int, per_rank_budget: int) -> LargerHostFix | None:
    """``None`` when the device pool is not known or ``wanted`` GB already holds more tokens."""
    tokens, cell, pre, weights = device.tokens, device.cell, device.pre, device.weights
    if not tokens or not cell or pre is None or weights is None:
        return None
    if wanted * GB // cell > tokens * (1 + HOST_OVER_DEVICE_MARGIN):
        return None
    minimum = math.ceil(tokens * cell * (1 + HOST_OVER_DEVICE_MARGIN) / GB)
    if minimum * GB <= per_rank_budget:
        return LargerHostFix(minimum, wanted, None)
    # No size both fits the host and exceeds the device pool: shrink the device pool instead
    # (its KV bytes are about pre × mfs − weights).
    device_most = wanted * GB / (1 + HOST_OVER_DEVICE_MARGIN)
    return LargerHostFix(
        minimum, wanted, math.floor((weights + device_most - cell) / pre * 100) / 100
    )


def _fit_protocol(
    report: BudgetReport, device: DevicePool, vkey: Version, size_gb: int, per_rank_budget: int
) -> None:
    """Where the host pool was blocked before 0.5.13, make sure the suggested --hicache-size
    holds more tokens than the device pool, lowering mem-fraction-static when no size fits."""
    if not {"host_oom", "host_not_larger"} & {m.code for m in report.messages}:
        return
    wanted = (report.suggestion or {}).get("--hicache-size", size_gb)
    if wanted is None:  # the suggestion drops the host pool
        return
    fix = larger_host_fix(device, wanted, per_rank_budget)
    if fix is None:
        return
    device_kv = format_bytes(device.kv_bytes or 0, "GB", places=2)
    if fix.mfs is None:
        report.suggestion = {"--hicache-size": fix.minimum}
        report.add(
            "info",
            "host_fix",
            f"SGLang {vkey} needs the host pool larger than the device pool ({device_kv} per "
            f"rank): use at least --hicache-size {fix.minimum}.",
        )
        return
    report.suggestion = {"--hicache-size": fix.wanted, "--mem-fraction-static": fix.mfs}
    report.add(
        "info",
        "host_fix",
        f"At this mem-fraction-static the device pool ({device_kv} per rank) is larger than any "
        f"host pool the node can pin, and SGLang {vkey} needs the host pool larger: use "
        f"--hicache-size {fix.wanted} with --mem-fraction-static {fix.mfs} or lower.",
    )
