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
are bytes.

Layout: this module checks the command and the GPUs, then sizes the device pool
(``budget_device``) and the host pool (``budget_host``) and says what the pools hold; the types
they share are in ``budget_types``. Every public name of those modules that callers used from
here is still importable from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from packaging.version import Version

from nodes.domain.budget_device import (
    DEFAULT_MAMBA_FULL_MEMORY_RATIO,
    DEFAULT_SWA_FULL_TOKENS_RATIO,
    DevicePool,
    default_mem_fraction,
    device_pool,
)
from nodes.domain.budget_host import (
    DEFAULT_HICACHE_RATIO,
    PINNED_SHARE_WARN,
    SGLANG_HOST_RESERVE_BYTES,
    V0_5_6,
    V0_5_13,
    V0_5_19,
    V0_5_21,
    host_pool,
)
from nodes.domain.budget_types import BudgetReport, Message, Neighbour, NodeMemory, Observed
from nodes.domain.geometry import ModelGeometry
from nodes.domain.remedy import WITHOUT_HICACHE, Change, describe
from nodes.domain.sglang_flags import ParsedCommand, sglang_version
from nodes.domain.units import GiB

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
    "Neighbour",
    "NodeMemory",
    "Observed",
    "check",
    "default_mem_fraction",
]

DEFAULT_OS_HEADROOM_BYTES = 4 * GiB


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

    The report's ``suggestion`` is a complete change: the command with it applied passes this
    same check (``ok`` or ``warn``, in ``suggestion_verdict``), or there is no suggestion.
    """

    def on_node(parsed: ParsedCommand) -> BudgetReport:
        return _check(
            parsed,
            node,
            version=version,
            geometry=geometry,
            weights_bytes=weights_bytes,
            os_headroom_bytes=os_headroom_bytes,
            request_tokens=request_tokens,
            observed=observed,
        )

    report = on_node(flags)
    if report.suggestion:
        after = _settle_suggestion(report, lambda change: on_node(_with_change(flags, change)))
        if after is not None:
            report.suggestion_cost = cost(report, after, request_tokens)
            report.add("info", "suggestion_cost", report.suggestion_cost["text"])
    if report.verdict == "block" or report.suggestion:
        _offer_without_hicache(report, flags, on_node, request_tokens)
    return report


def cost(before: BudgetReport, after: BudgetReport, request_tokens: int) -> dict[str, Any]:
    """What a change costs: the device KV pool per rank before and after (tokens), and how many
    requests of ``request_tokens`` (prompt and output) it holds at once, with a sentence that
    says so; "unavailable" with the reason where the pool cannot be sized."""
    was, now = before.device_kv_tokens_per_rank, after.device_kv_tokens_per_rank
    doc: dict[str, Any] = {
        "kv_tokens_before": was,
        "kv_tokens_after": now,
        "request_tokens": request_tokens,
        "requests_before": was // request_tokens if was is not None else None,
        "requests_after": now // request_tokens if now is not None else None,
    }
    if was is None or now is None or was <= 0:
        doc["text"] = (
            "What it costs in device pool tokens is unavailable: the pool cannot be sized "
            "without the model's geometry."
        )
        return doc
    if now == was:
        doc["text"] = (
            f"It keeps the device KV pool at {now:,} tokens per rank "
            f"({doc['requests_after']:,} requests of {request_tokens:,} tokens at once)."
        )
        return doc
    share = f"{(now - was) / was * 100:+.0f} %".replace("-", "−")
    moved = "shrinks" if now < was else "grows"
    doc["text"] = (
        f"It {moved} the device KV pool from {was:,} to {now:,} tokens per rank ({share}): "
        f"{doc['requests_before']:,} → {doc['requests_after']:,} requests of "
        f"{request_tokens:,} tokens at once."
    )
    return doc


def _offer_without_hicache(
    report: BudgetReport,
    flags: ParsedCommand,
    on_node: Callable[[ParsedCommand], BudgetReport],
    request_tokens: int,
) -> None:
    """Where HiCache is on and a change is forced (a block, a suggestion), offer removing it: the
    device pool keeps its fraction; prefixes evicted from it are computed again instead of
    loaded back from host memory (worth little at a low prefix hit rate)."""
    if not flags.get("enable_hierarchical_cache", default=False):
        return
    drop: Change = dict(WITHOUT_HICACHE)
    for dest in sorted(flags.given):
        if dest.startswith("hicache_"):
            drop["--" + dest.replace("_", "-")] = None
    if report.suggestion is not None and all(
        report.suggestion.get(k, "unset") is None for k in drop
    ):
        return  # the suggestion is already this
    without = on_node(_with_change(flags, drop))
    if without.verdict == "block":
        return
    priced = cost(report, without, request_tokens)
    text = (
        f"Or remove HiCache (drop {' and '.join(drop)}), keeping the rest: this check passes it "
        f"({without.verdict}). {priced['text']} Prefixes evicted from the device pool are then "
        "computed again instead of loaded back from host memory: little is lost at a low prefix "
        "hit rate."
    )
    report.alternatives.append(
        {
            "change": drop,
            "verdict": without.verdict,
            "kv_tokens_per_rank": without.device_kv_tokens_per_rank,
            "cost": priced,
            "text": text,
        }
    )
    report.add("info", "alternative", text)


#: How many times a suggestion is widened by what the check of it suggests in turn (the host
#: pool's size, then the mem-fraction that lets the host pool exceed the device pool, …).
SUGGESTION_ROUNDS = 4


def _settle_suggestion(
    report: BudgetReport, recheck: Callable[[Change], BudgetReport]
) -> BudgetReport | None:
    """Replace ``report.suggestion`` by the change that passes: the check of the command with
    the suggestion applied; where that is still blocked, its own suggestion added, up to
    ``SUGGESTION_ROUNDS`` times. No suggestion where none passes. Returns the check of the
    command with the suggestion, None without one."""
    change: Change = dict(report.suggestion or {})
    for _ in range(SUGGESTION_ROUNDS):
        after = recheck(change)
        if after.verdict != "block":
            report.suggestion = change
            report.suggestion_verdict = after.verdict
            report.add(
                "info",
                "suggested_change",
                f"Suggested change: {describe(change)} (this check passes it: {after.verdict}).",
            )
            return after
        more = after.suggestion or {}
        if all(change.get(option) == value for option, value in more.items()):
            break
        change = {**change, **more}
    report.suggestion = None
    report.add(
        "info",
        "no_suggestion",
        "No change of these flags alone passes this check; see the blocks above.",
    )
    return None


def _with_change(flags: ParsedCommand, change: Change) -> ParsedCommand:
    """``flags`` with each option of ``change`` set (its argparse dest: the long option's name
    with dashes as underscores); ``None`` restores the flag's default by leaving it unset."""
    values, given = dict(flags.values), set(flags.given)
    for option, value in change.items():
        dest = option.lstrip("-").replace("-", "_")
        values[dest] = value
        given.add(dest)
    return replace(flags, values=values, given=given, issues=list(flags.issues))


def _check(
    flags: ParsedCommand,
    node: NodeMemory,
    *,
    version: str,
    geometry: ModelGeometry | None,
    weights_bytes: int | None,
    os_headroom_bytes: int,
    request_tokens: int,
    observed: Observed | None,
) -> BudgetReport:
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
    host_pool(flags, node, device, ranks, report, vkey, os_headroom_bytes)
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
    """The GPUs the ranks take must exist, and TP must divide the model's heads."""
    base = int(flags.get("base_gpu_id", default=0))
    step = int(flags.get("gpu_id_step", default=1))
    last = base + (ranks - 1) * step
    count = _visible_gpus(flags, node, report)
    report.lines.append(f"GPUs used: {base} … {last} (step {step}); {count} available")
    if last >= count:
        report.add(
            "block",
            "too_many_ranks",
            f"{ranks} ranks need GPU indexes up to {last}, but the node has {count} GPUs",
        )
    tp = int(flags.get("tp_size", "tensor_parallel_size", default=1))
    if geometry is not None:
        _heads(tp, geometry, report)


def _visible_gpus(flags: ParsedCommand, node: NodeMemory, report: BudgetReport) -> int:
    """The node's GPUs that CUDA_VISIBLE_DEVICES leaves SGLang (blocks names it lacks)."""
    count = len(node.gpu_memory_bytes)
    visible = flags.env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return count
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
    return count


def _heads(tp: int, geometry: ModelGeometry, report: BudgetReport) -> None:
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
