"""A running launch's capacity as the panel read it (``Launch.metrics_series``, the follower's
samples of ``/metrics``): its bottleneck with the figures, and the changes that would lift it,
each checked by the budget on the launch's node as its own relaunch would find it
(``domain.capacity``; ``GET /api/launches/{id}/capacity`` and ``manage.py capacity``)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from nodes.domain import capacity, remedy
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import Launch, ProfileRevision
from nodes.models.choices import LAUNCH_ACTIVE, LaunchStatus
from nodes.services.model_facts import model_of
from nodes.services.planner import mem_fraction_of
from nodes.services.profiles import checker, evaluate, node_memory_for, save_revision
from nodes.types import Actor


def _server(launch: Launch) -> capacity.Server:
    info = launch.server_info if isinstance(launch.server_info, dict) else {}
    dp = _whole(info.get("dp_size")) or 1
    return capacity.Server(
        pool_tokens=_whole(info.get("max_total_num_tokens")),
        max_running_requests=_whole(info.get("max_running_requests")),
        hicache=bool(info.get("enable_hierarchical_cache")),
        dp=dp,
        gpus=len(launch.gpus) if isinstance(launch.gpus, list) and launch.gpus else None,
    )


def bottleneck_of(launch: Launch) -> capacity.Capacity:
    """The bottleneck alone (cheap: no budget is run), for a page that polls."""
    samples = [capacity.Sample.of(s) for s in launch.metrics_series or [] if isinstance(s, dict)]
    ended = launch.status not in LAUNCH_ACTIVE
    return capacity.bottleneck(samples, _server(launch), ended=ended)


class CapacityRefused(ValueError):
    """The change is not one the advisor offers now, or the budget blocks it."""


def apply_option(
    launch: Launch, change: dict[str, Any], *, actor: Actor, request: HttpRequest | None = None
) -> ProfileRevision:
    """Save one of the options offered now as the profile's next revision, re-validated on
    the launch's node as its relaunch would find it. Raises ``CapacityRefused`` for a change
    that is not offered now (nothing is saved)."""
    offered = [o["change"] for o in capacity_of(launch)["options"]]
    if change not in offered:
        raise CapacityRefused("that change is not offered for this launch now; reload the page")
    node = launch.node
    args = remedy.with_changes(
        list(launch.revision.args), change, table(node.sglang_version or DEFAULT_VERSION)
    )
    model = model_of(node, args, wait=0)
    name = launch.revision.profile.name
    memory = node_memory_for(node, name, viewer=None)
    env = dict(launch.revision.env or {})
    report = evaluate(args, node, model, env=env, memory=memory, profile=name)
    if report.verdict == "block":
        raise CapacityRefused("the budget blocks it on this node now")
    return save_revision(
        profile_name=launch.revision.profile.name,
        args=args,
        env=dict(launch.revision.env or {}),
        message=f"Capacity of launch #{launch.pk}: {remedy.describe(change)}",
        node=node,
        report=report,
        model=model,
        actor=actor,
        request=request,
    )


def capacity_of(launch: Launch) -> dict[str, Any]:
    """``{"launch", "bottleneck", "figures", "options": [{"change", "verdict",
    "expected_running_requests", "expected_throughput_change", "why"}], "why"}``: ``change``
    as ``manage.py diagnose --json``'s; ``bottleneck`` one of ``domain.capacity.BOTTLENECKS``
    or ``unknown``. The model is read as a page reads it (never waiting on the node): until it
    is, no option is computed and ``why`` says so."""
    info = launch.server_info if isinstance(launch.server_info, dict) else {}
    server = _server(launch)
    found = bottleneck_of(launch)
    served = info.get("mem_fraction_static")
    if isinstance(served, int | float) and not isinstance(served, bool):
        mfs: float | None = float(served)
    else:  # a server that does not say: the fraction as the budget resolves it
        node = launch.node
        flags = parse_command(
            list(launch.revision.args), table(node.sglang_version or DEFAULT_VERSION)
        )
        mfs = mem_fraction_of(
            flags, node_memory_for(node, launch.revision.profile.name, viewer=None)
        )
    offered = capacity.options(
        found,
        server,
        mfs=mfs,
        kv_dtype=str(info.get("kv_cache_dtype") or "auto"),
        recheck=_rechecker(launch),
        node_gpus=launch.node.gpus.count(),
    )
    why = found.why
    if (
        found.bottleneck == "unknown"
        and not launch.metrics_series
        and launch.status != LaunchStatus.READY
    ):
        why = f"the launch is {launch.get_status_display().lower()} and has no load figures"
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
    args = list(launch.revision.args)
    return checker(
        args,
        node,
        model_of(node, args, wait=0),
        env=dict(launch.revision.env or {}),
        memory=node_memory_for(node, launch.revision.profile.name, viewer=None),
        profile=launch.revision.profile.name,
    )


def _whole(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None
