"""The memory budget of a launch profile on a node, per TP rank, with the arithmetic shown.

Sources: shared/reference/sglang.md §1 (flags and units), §2 (host pool: ``--hicache-size`` is
decimal GB **per rank**; ratio × the rank's device KV bytes; SGLang's 10 GiB host reserve; the
per-rank check up to 0.5.18 and the split by ranks per host from 0.5.19), §3 (device pool:
``rest = avail after weights − free before weights × (1 − mem-fraction-static)``, ÷ the KV bytes
per token, capped by ``--max-total-tokens``, rounded down to pages), §3b (weights per rank are
more than checkpoint ÷ TP: ``nodes.domain.weights``; free memory before load is the card less
CUDA context and NCCL: ``nodes.domain.gpu_overhead``), §9 (validation rules). Figures SGLang
logged (``Load weight begin/end``) replace both estimates when given (``Observed``). Hybrid
state pools and sliding-window pools follow SGLang's splits (``budget_device._split``). All sizes
are bytes. The device pool is sized in ``budget_device``; its public names are re-exported here.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from nodes.domain.budget_device import (
    DEFAULT_MAMBA_FULL_MEMORY_RATIO,
    DEFAULT_SWA_FULL_TOKENS_RATIO,
    DevicePool,
    default_mem_fraction,
    device_pool,
)
from nodes.domain.budget_types import BudgetReport, Message, NodeMemory, Observed
from nodes.domain.geometry import ModelGeometry
from nodes.domain.sglang_flags import ParsedCommand, sglang_version
from nodes.domain.units import GB, GiB, format_bytes

__all__ = [
    "DEFAULT_HICACHE_RATIO",
    "DEFAULT_MAMBA_FULL_MEMORY_RATIO",
    "DEFAULT_OS_HEADROOM_BYTES",
    "DEFAULT_SWA_FULL_TOKENS_RATIO",
    "PINNED_SHARE_WARN",
    "SGLANG_HOST_RESERVE_BYTES",
    "V0_5_6",
    "V0_5_13",
    "V0_5_19",
    "V0_5_21",
    "BudgetReport",
    "Message",
    "NodeMemory",
    "Observed",
    "check",
    "default_mem_fraction",
]

SGLANG_HOST_RESERVE_BYTES = 10 * GiB  # §2: available − 10 GiB in every version
DEFAULT_OS_HEADROOM_BYTES = 4 * GiB
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


def check(
    flags: ParsedCommand,
    node: NodeMemory,
    *,
    version: str,
    geometry: ModelGeometry | None = None,
    weights_bytes: int | None = None,
    os_headroom_bytes: int = DEFAULT_OS_HEADROOM_BYTES,
    request_tokens: int = 4096,
    observed: Observed | None = None,
) -> BudgetReport:
    """Check a parsed SGLang command against a node; never raises for a bad profile.

    ``version`` is the node's SGLang version; ``geometry`` and ``weights_bytes`` (the checkpoint
    size) are needed for the device pool and ratio-sized host pools, and are reported as
    unknown otherwise. ``observed`` figures (free memory before load, weights per rank, both
    bytes) replace the estimates of the same name. Returns a ``BudgetReport``.
    """
    report = BudgetReport()
    try:
        vkey = sglang_version(version)
    except ValueError:
        vkey = Version("0")  # unreadable: the oldest rules, as for the oldest flag table
    for issue in flags.issues:
        report.add("block", f"flag_{issue.code}", issue.message)
    if not flags.values:
        return report
    for problem in _implausible(flags, node):
        report.add("block", "invalid_value", problem)
    if report.verdict == "block" and any(m.code == "invalid_value" for m in report.messages):
        return report
    ranks = _ranks(flags, report, vkey)
    if ranks is None:
        return report
    _gpus_and_heads(flags, node, geometry, ranks, report)
    device = device_pool(flags, node, geometry, weights_bytes, report, observed or Observed())
    _host_pool(flags, node, geometry, device, ranks, report, vkey, os_headroom_bytes)
    _capacity(device, report, request_tokens)
    return report


def _implausible(flags: ParsedCommand, node: NodeMemory) -> list[str]:
    """Values SGLang or the hardware cannot run with, found before any arithmetic."""
    problems = []

    def number(*dests: str) -> float | None:
        value = flags.get(*dests)
        return None if value is None else float(value)

    mfs = number("mem_fraction_static")
    if mfs is not None and not 0 < mfs < 1:
        problems.append(f"--mem-fraction-static {mfs} must lie between 0 and 1")
    ratio = number("hicache_ratio")
    if ratio is not None and not 0 < ratio < 1000:
        problems.append(f"--hicache-ratio {ratio} must be a positive number")
    for dest, flag in (("hicache_size", "--hicache-size"), ("cpu_offload_gb", "--cpu-offload-gb")):
        value = number(dest)
        if value is not None and not 0 <= value <= 10**6:
            problems.append(f"{flag} {value:g} must be between 0 and 1,000,000 (GB per rank)")
    tokens = number("max_total_tokens")
    if tokens is not None and tokens < 1:
        problems.append(f"--max-total-tokens {tokens:g} must be at least 1")
    if int(flags.get("base_gpu_id", default=0)) < 0:
        problems.append("--base-gpu-id cannot be negative")
    if int(flags.get("gpu_id_step", default=1)) < 1:
        problems.append("--gpu-id-step must be at least 1")
    if any(size <= 0 for size in node.gpu_memory_bytes):
        problems.append("a GPU of the node has no memory size")
    return problems


def _ranks(flags: ParsedCommand, report: BudgetReport, vkey: Version) -> int | None:
    tp = int(flags.get("tp_size", "tensor_parallel_size", default=1))
    pp = int(flags.get("pp_size", "pipeline_parallel_size", default=1))
    nnodes = int(flags.get("nnodes", default=1))
    dp = int(flags.get("dp_size", "data_parallel_size", default=1))
    if tp < 1 or pp < 1 or nnodes < 1 or dp < 1:
        report.add("block", "parallelism", "tp, pp, dp and nnodes must be at least 1")
        return None
    if (tp * pp) % nnodes:
        report.add(
            "block", "parallelism", f"tp × pp = {tp * pp} is not divisible by nnodes {nnodes}"
        )
        return None
    ranks = tp * pp // nnodes
    report.lines.append(f"Ranks per node: tp {tp} × pp {pp} ÷ nnodes {nnodes} = {ranks}")
    attention_dp = (
        bool(flags.get("enable_dp_attention", default=False))
        or int(flags.get("attn_dp_size", default=1)) > 1
    )
    if dp > 1 and not attention_dp:
        ranks *= dp
        report.lines.append(f"  × {dp} data-parallel replicas on this node = {ranks} ranks")
    report.ranks_per_node = ranks
    return ranks


def _gpus_and_heads(
    flags: ParsedCommand,
    node: NodeMemory,
    geometry: ModelGeometry | None,
    ranks: int,
    report: BudgetReport,
) -> None:
    base = int(flags.get("base_gpu_id", default=0))
    step = int(flags.get("gpu_id_step", default=1))
    last = base + (ranks - 1) * step
    count = len(node.gpu_memory_bytes)
    visible = flags.env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        shown = [v.strip() for v in visible.split(",") if v.strip()]
        missing = [v for v in shown if not v.isdigit() or int(v) >= count]
        if missing:
            report.add(
                "block",
                "visible_devices",
                f"CUDA_VISIBLE_DEVICES names GPUs the node does not have: {', '.join(missing)}",
            )
        count = min(count, len(shown))
        report.lines.append(f"CUDA_VISIBLE_DEVICES={visible}: {count} GPUs visible to SGLang")
    report.lines.append(f"GPUs used: {base} … {last} (step {step}); {count} available")
    if last >= count:
        report.add(
            "block",
            "too_many_ranks",
            f"{ranks} ranks need GPU indexes up to {last}, but the node has {count} GPUs",
        )
    tp = int(flags.get("tp_size", "tensor_parallel_size", default=1))
    if geometry is None:
        return
    if geometry.attention_heads is not None and geometry.attention_heads % tp:
        report.add(
            "block",
            "tp_heads",
            f"tp {tp} does not divide the model's {geometry.attention_heads} attention heads",
        )
    if not geometry.is_mla and geometry.kv_heads % tp and tp % geometry.kv_heads:
        report.add(
            "block",
            "tp_kv_heads",
            f"tp {tp} and the model's {geometry.kv_heads} KV heads do not divide each other",
        )


def _host_pool(
    flags: ParsedCommand,
    node: NodeMemory,
    geometry: ModelGeometry | None,
    device: DevicePool,
    ranks: int,
    report: BudgetReport,
    vkey: Version,
    os_headroom: int,
) -> None:
    offload = int(flags.get("cpu_offload_gb", default=0) or 0) * GB
    if not flags.get("enable_hierarchical_cache", default=False) and not offload:
        report.lines.append("No hierarchical cache: no host pool")
        if "hicache_size" in flags.given or "hicache_ratio" in flags.given:
            report.add(
                "warn",
                "hicache_ignored",
                "--hicache-size/--hicache-ratio do nothing without --enable-hierarchical-cache",
            )
        return
    size_gb = int(flags.get("hicache_size", default=0) or 0)
    ratio_given = "hicache_ratio" in flags.given
    per_rank: int | None = None
    host_tokens = None
    if flags.get("enable_hierarchical_cache", default=False):
        if size_gb > 0:
            if device.cell:
                host_tokens = size_gb * GB // device.cell + (0 if vkey < V0_5_6 else 1)
                per_rank = host_tokens * device.cell
            else:
                per_rank = size_gb * GB
            report.lines.append(
                f"Host pool per rank: --hicache-size {size_gb} = {size_gb} GB (10^9 bytes) per "
                f"rank → {format_bytes(per_rank, 'GB', places=2)}"
            )
        elif vkey >= V0_5_21 and not ratio_given:
            budget = _host_budget(node, os_headroom, BudgetReport())
            if budget is not None and budget <= 0:
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
            per_rank = 0
        else:
            given = flags.get("hicache_ratio")
            ratio = float(given) if given is not None else DEFAULT_HICACHE_RATIO
            if device.kv_bytes is None or device.tokens is None:
                report.add(
                    "warn",
                    "host_unknown",
                    f"--hicache-ratio {ratio} sizes the host pool from the device pool, which is "
                    "unknown without the model's geometry: the host footprint cannot be checked",
                )
                return
            host_tokens = int(device.tokens * ratio)
            per_rank = int(device.kv_bytes * ratio)
            device_gb = format_bytes(device.kv_bytes, "GB", places=2)
            report.lines.append(
                f"Host pool per rank: ratio {ratio} × {device_gb} device KV = "
                f"{format_bytes(per_rank, 'GB', places=2)}"
            )
        if (
            vkey < V0_5_13
            and host_tokens is not None
            and device.tokens
            and host_tokens <= device.tokens
        ):
            report.add(
                "block",
                "host_not_larger",
                f"SGLang {vkey} requires the host pool to hold more tokens "
                f"than the device pool ({host_tokens:,} ≤ {device.tokens:,}); it asserts at start",
            )
    per_rank = (per_rank or 0) + offload
    if offload:
        report.lines.append(f"  + --cpu-offload-gb: {format_bytes(offload, 'GB')} per rank")
    per_node = per_rank * ranks
    report.host_pool_bytes_per_rank = per_rank
    report.host_pool_bytes_per_node = per_node
    report.lines.append(
        f"Host pools on the node: {format_bytes(per_rank, 'GB', places=2)} × {ranks} ranks = "
        f"{format_bytes(per_node, 'GB', places=2)} pinned"
    )
    budget = _host_budget(node, os_headroom, report)
    if budget is None:
        report.add("warn", "host_ram_unknown", "Host RAM unknown: discover the node to check")
        return
    if per_node > budget:
        _host_block(flags, report, ranks, per_rank, per_node, budget, size_gb, offload, node)
    elif node.host_ram_bytes and per_node > PINNED_SHARE_WARN * node.host_ram_bytes:
        share = per_node / node.host_ram_bytes
        report.add(
            "warn",
            "pinned_share",
            f"{share:.0%} of host RAM would be pinned; pinned memory cannot be reclaimed, and "
            "growth under load has OOM-killed servers that fitted at start",
        )
    _fit_protocol(flags, report, device, vkey, size_gb)
    if flags.get("enable_hierarchical_cache", default=False) and ranks > 1 and vkey < V0_5_19:
        report.add(
            "warn",
            "per_rank_check",
            f"SGLang {vkey} checks host memory in each rank alone: its own "
            "check does not protect this node from the total above",
        )


def _fit_protocol(
    flags: ParsedCommand,
    report: BudgetReport,
    device: DevicePool,
    vkey: Version,
    size_gb: int,
) -> None:
    """Up to 0.5.12 the host pool must hold more tokens than the device pool (§1d): make sure the
    suggested --hicache-size does, lowering mem-fraction-static when no size fits the budget."""
    if not flags.get("enable_hierarchical_cache", default=False) or vkey >= V0_5_13:
        return
    if not device.tokens or not device.cell or device.pre is None or device.weights is None:
        return
    blocked_here = {"host_oom", "host_not_larger"} & {m.code for m in report.messages}
    if not blocked_here:
        return
    wanted = (report.suggestion or {}).get("--hicache-size", size_gb)
    minimum = device.tokens * device.cell // GB + 1
    if wanted >= minimum:
        return
    per_rank_budget = (
        report.host_budget_bytes // report.ranks_per_node
        if report.host_budget_bytes is not None and report.ranks_per_node
        else None
    )
    if per_rank_budget is None or minimum * GB <= per_rank_budget:
        report.suggestion = {"--hicache-size": minimum}
        report.add(
            "info",
            "host_fix",
            f"SGLang {vkey} needs the host pool larger than the device pool "
            f"({format_bytes(device.kv_bytes or 0, 'GB', places=2)} per rank): use at least "
            f"--hicache-size {minimum}.",
        )
        return
    # No size both fits the host and exceeds the device pool: shrink the device pool instead.
    mfs = int((device.weights + wanted * GB - device.cell) / device.pre * 100) / 100
    report.suggestion = {"--hicache-size": wanted, "--mem-fraction-static": mfs}
    report.add(
        "info",
        "host_fix",
        f"At this mem-fraction-static the device pool "
        f"({format_bytes(device.kv_bytes or 0, 'GB', places=2)} per rank) is larger than any "
        f"host pool the node can pin, and SGLang "
        f"{vkey} needs the host pool larger: use --hicache-size {wanted} with "
        f"--mem-fraction-static {mfs} or lower.",
    )


def _host_budget(node: NodeMemory, os_headroom: int, report: BudgetReport) -> int | None:
    figures = []
    if node.host_ram_bytes:
        ram, spare = format_bytes(node.host_ram_bytes, "GB"), format_bytes(os_headroom, "GB", 2)
        figures.append(
            (f"host RAM {ram} − {spare} for the OS =", node.host_ram_bytes - os_headroom)
        )
    if node.mem_available_bytes is not None:
        figures.append(("MemAvailable now", node.mem_available_bytes))
    if node.cgroup_limit_bytes is not None:
        figures.append(("cgroup limit", node.cgroup_limit_bytes))
    if not figures:
        return None
    label, low = min(figures, key=lambda f: f[1])
    budget = max(0, low - SGLANG_HOST_RESERVE_BYTES)
    shown = ", ".join(f"{name} {format_bytes(v, 'GB', places=2)}" for name, v in figures)
    total = format_bytes(budget, "GB", places=2)
    report.lines.append(f"Host budget: min({shown}) − SGLang's 10 GiB reserve = {total}")
    report.host_budget_bytes = budget
    return budget


def _host_block(
    flags: ParsedCommand,
    report: BudgetReport,
    ranks: int,
    per_rank: int,
    per_node: int,
    budget: int,
    size_gb: int,
    offload: int,
    node: NodeMemory,
) -> None:
    ram = f" of a {format_bytes(node.host_ram_bytes, 'GB')} node" if node.host_ram_bytes else ""
    report.add(
        "block",
        "host_oom",
        f"{ranks} × {format_bytes(per_rank, 'GB', places=2)} = "
        f"{format_bytes(per_node, 'GB', places=2)} of pinned host memory against a budget of "
        f"{format_bytes(budget, 'GB', places=2)}{ram}: the ranks together would exhaust the "
        "node and the kernel would OOM-kill them",
    )
    largest = max(0, (budget // ranks - offload) // GB)
    if not flags.get("enable_hierarchical_cache", default=False):
        fits = max(0, budget // ranks // GB)
        report.add(
            "info", "host_fix", f"The largest --cpu-offload-gb that fits is {fits} (GB per rank)."
        )
        report.suggestion = {"--cpu-offload-gb": fits}
        return
    suggestion: dict[str, Any] = {"--hicache-size": largest}
    text = f"The largest --hicache-size that fits is {largest} (GB per rank)."
    if size_gb:
        meant = size_gb // ranks
        # Only a size far beyond the node reads as a node total typed as a per-rank value.
        if meant <= largest and per_node > 2 * budget:
            suggestion = {"--hicache-size": meant}
            text = (
                f"If {size_gb} GB was meant for the whole node, that is --hicache-size {meant} per "
                f"rank ({size_gb} GB ÷ {ranks} ranks). " + text
            )
    report.add("info", "host_fix", text)
    report.suggestion = suggestion


def _capacity(device: DevicePool, report: BudgetReport, request_tokens: int) -> None:
    if device.tokens:
        report.lines.append(
            f"Capacity: {device.tokens:,} tokens in the device pool per replica ≈ "
            f"{device.tokens // request_tokens:,} concurrent requests of {request_tokens:,} tokens"
        )
    if device.cell and report.host_pool_bytes_per_rank:
        host_tokens = report.host_pool_bytes_per_rank // device.cell
        report.lines.append(
            f"  host pool: {host_tokens:,} more tokens per replica ≈ "
            f"{host_tokens // request_tokens:,} requests' worth of cached prefixes"
        )
