"""A running launch's capacity as the panel read it (``Launch.metrics_series``, the follower's
samples of ``/metrics``): its bottleneck with the figures, and the changes that would lift it,
each checked by the budget on the launch's node as its own relaunch would find it
(``domain.capacity``; ``GET /api/launches/{id}/capacity`` and ``manage.py capacity``)."""

from __future__ import annotations

from typing import Any

from nodes.domain import capacity, remedy
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import Launch
from nodes.services.model_facts import model_of
from nodes.services.profiles import evaluate, node_memory_for


def capacity_of(launch: Launch) -> dict[str, Any]:
    """``{"launch", "bottleneck", "figures", "options": [{"change", "verdict",
    "expected_running_requests", "expected_throughput_change", "why"}], "why"}``: ``change``
    as ``manage.py diagnose --json``'s; ``bottleneck`` one of ``domain.capacity.BOTTLENECKS``
    or ``unknown``. The model is read as a page reads it (never waiting on the node): until it
    is, no option is computed and ``why`` says so."""
    info = launch.server_info if isinstance(launch.server_info, dict) else {}
    server = capacity.Server(
        pool_tokens=_whole(info.get("max_total_num_tokens")),
        max_running_requests=_whole(info.get("max_running_requests")),
        hicache=bool(info.get("enable_hierarchical_cache")),
    )
    samples = [capacity.Sample.of(s) for s in launch.metrics_series or [] if isinstance(s, dict)]
    found = capacity.bottleneck(samples, server)
    mfs = info.get("mem_fraction_static")
    offered = capacity.options(
        found,
        server,
        mfs=float(mfs) if isinstance(mfs, int | float) and not isinstance(mfs, bool) else None,
        kv_dtype=str(info.get("kv_cache_dtype") or "auto"),
        recheck=_rechecker(launch),
    )
    why = found.why
    if found.bottleneck == "kv-bound" and not offered:
        why = "no change of the flags checked here lifts it on this node (or the model is not read)"
    return {
        "launch": launch.pk,
        "bottleneck": found.bottleneck,
        "held_s": round(found.held_s, 1),
        "figures": found.figures,
        "options": [
            {
                "change": o.change,
                "verdict": o.verdict,
                "expected_running_requests": o.expected_running_requests,
                "expected_throughput_change": o.expected_throughput_change,
                "why": o.why,
            }
            for o in offered
        ],
        "why": why,
    }


def _rechecker(launch: Launch) -> Any:
    """The budget of the launch's revision with a change applied, on its node as its own
    relaunch would find it (its running server's memory counted free)."""
    node = launch.node
    flags = table(node.sglang_version or DEFAULT_VERSION)
    base = list(launch.revision.args)
    env = dict(launch.revision.env or {})
    memory = node_memory_for(node, launch.revision.profile.name)

    def recheck(change: dict[str, Any]) -> capacity.Checked:
        try:
            args = remedy.with_changes(base, change, flags)
        except ValueError:
            return capacity.Checked("block", None)
        report = evaluate(args, node, model_of(node, args, wait=0), env=env, memory=memory)
        warnings = tuple(m.text for m in report.messages if m.level == "warn")
        return capacity.Checked(report.verdict, report.device_kv_tokens_per_rank, warnings)

    return recheck


def _whole(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None
