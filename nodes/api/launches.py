"""Launches: list, start, one, its log after a sequence number, stop."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Query, Router, Schema, Status
from ninja.errors import HttpError

from nodes.api.auth import OperatorAuth, require
from nodes.api.nodes import named
from nodes.api.pagination import Rows, paged
from nodes.api.schemas import ERRORS, READ_ERRORS, Accepted, LaunchIn, LaunchOut, LogOut
from nodes.models import Launch
from nodes.models.choices import LAUNCH_ENDED, LaunchStatus, Role
from nodes.queue import send
from nodes.services import capacity, fixes, inventory
from nodes.services.teams import visible_launches
from nodes.workflows import launching

router = Router(tags=["launches"])
LOG_BATCH = 1000


class LaunchFilter(Schema):
    status: LaunchStatus | None = None
    node: str | None = None


def launch_json(launch: Launch) -> dict[str, Any]:
    return {
        **launch.summary(),
        "checks": launch.checks or [],
        "diagnosis": fixes.stored(launch),
    }


@router.get("", response={200: list[LaunchOut], **READ_ERRORS})
@paged
def list_launches(request: HttpRequest, filters: Query[LaunchFilter]) -> Any:
    """Launches, newest first, one page at a time."""
    rows = visible_launches(request.user).select_related("node", "revision__profile")
    if filters.status:
        rows = rows.filter(status=filters.status)
    if filters.node:
        rows = rows.filter(node=named(filters.node))
    return Rows(rows, launch_json)


@router.post("", response={202: LaunchOut, 503: dict[str, str], **ERRORS}, auth=OperatorAuth())
def create_launch(request: HttpRequest, body: LaunchIn) -> Any:
    """Launch a profile revision (``name@N``, or ``name`` for its latest) or a ``command`` line
    on ``node``; pre-flight runs on the node next (``status`` moves from ``pending``)."""
    require(request, Role.OPERATOR)
    names = [n.strip() for n in body.node.split(",")]
    if len(names) > 64 or any(not n for n in names):
        raise HttpError(400, "node: a name, or at most 64 names separated by commas (node 0 first)")
    if any("\x00" in n for n in names):
        raise HttpError(404, "no such node")
    try:
        group = inventory.nodes_named(names)
    except inventory.UnknownNode as exc:
        raise HttpError(404, f"no node named {exc.args[0][:63]!r}") from None
    node = group[0]
    if bool(body.profile) == bool(body.command):
        raise HttpError(400, "give a profile or a command, not both")
    try:
        revision = launching.resolve_profile(body.profile, request.user) if body.profile else None
        launch = launching.submit(
            node=node,
            revision=revision,
            command=body.command,
            gpus=body.gpus,
            overrides=body.overrides,
            timeout_s=body.timeout_s,
            port=body.port,
            actor=request.user,
            request=request,
            model_wait=settings.RANKWISE_MODEL_READ_WAIT_SECONDS,
            nodes=group if len(group) > 1 else (),
        )
    except launching.LaunchInputError as exc:
        raise HttpError(400, str(exc)) from None
    return Status(202, launch_json(launch))


@router.get("/{launch_id}", response={200: LaunchOut, **READ_ERRORS})
def get_launch(request: HttpRequest, launch_id: int) -> Any:
    return launch_json(get_object_or_404(visible_launches(request.user), pk=launch_id))


@router.get("/{launch_id}/capacity", response={200: dict[str, Any], **READ_ERRORS})
def launch_capacity(request: HttpRequest, launch_id: int) -> Any:
    """What bounds the running server (from the load gauges the panel sampled) and the changes
    that would lift it, each checked by the budget first: ``{"launch", "bottleneck",
    "held_s", "figures", "options": [{"change", "verdict", "expected_running_requests",
    "expected_throughput_change", "why"}], "why"}``."""
    launch = get_object_or_404(
        visible_launches(request.user).select_related("node", "revision__profile"), pk=launch_id
    )
    return capacity.capacity_of(launch)


@router.get("/{launch_id}/log", response={200: LogOut, **READ_ERRORS})
def launch_log(request: HttpRequest, launch_id: int, after: int = 0) -> Any:
    """Stored log lines after sequence number ``after`` (at most 1,000 per call)."""
    launch = get_object_or_404(visible_launches(request.user), pk=launch_id)
    rows = launch.lines.filter(seq__gt=max(after, 0)).values_list("seq", "text")[:LOG_BATCH]
    return {
        "lines": list(rows),
        "last_seq": launch.last_seq,
        "ended": launch.status in LAUNCH_ENDED and launch.log_complete,
    }


@router.post(
    "/{launch_id}/stop",
    response={202: Accepted, 503: dict[str, str], **ERRORS},
    auth=OperatorAuth(),
)
def stop(request: HttpRequest, launch_id: int) -> Any:
    require(request, Role.OPERATOR)
    launch = get_object_or_404(visible_launches(request.user), pk=launch_id)
    if launch.status in LAUNCH_ENDED:
        return Status(202, {"detail": f"launch #{launch.pk} already ended ({launch.status})"})
    send("nodes.stop_launch", launch.pk, request.user.pk)  # QueueUnavailable: 503
    return Status(202, {"detail": f"stopping launch #{launch.pk}", "id": launch.pk})
