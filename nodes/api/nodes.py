"""Nodes: list, one, discover; their GPUs' holders; a cleanup of their GPUs."""

from __future__ import annotations

from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Router, Status
from ninja.errors import HttpError

from nodes import ssh
from nodes.api.auth import OperatorAuth, require
from nodes.api.pagination import Rows, paged
from nodes.api.schemas import ERRORS, READ_ERRORS, Accepted, CleanupIn, Error, NodeOut
from nodes.models import Node
from nodes.models.choices import Role
from nodes.queue import send
from nodes.services import holders, teams
from nodes.services.audit import record
from nodes.services.credentials import target_for
from nodes.workflows import cleanup

#: How long the API waits for a worker's reading of the GPU holders (the task's limit).
HOLDERS_WAIT_S = 90

router = Router(tags=["nodes"])


def node_json(node: Node) -> dict[str, Any]:
    return {
        "id": node.pk,
        "name": node.name,
        "host": node.host,
        "status": node.status,
        "status_reason": node.status_reason,
        "sglang_version": node.sglang_version,
        "host_ram_bytes": node.host_ram_bytes,
        "mem_available_bytes": node.mem_available_bytes,
        "last_seen": node.last_seen,
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "memory_total_bytes": g.memory_total_bytes,
                "memory_used_bytes": g.memory_used_bytes,
            }
            for g in node.gpus.all()
        ],
    }


def named(name: str) -> Node:
    if "\x00" in name:
        raise HttpError(404, "no such node")
    return get_object_or_404(Node.objects.prefetch_related("gpus"), name=name)


@router.get("", response={200: list[NodeOut], **READ_ERRORS})
@paged
def list_nodes(request: HttpRequest) -> Any:
    """Nodes by name, one page at a time."""
    return Rows(Node.objects.prefetch_related("gpus"), node_json)


@router.get("/{name}", response={200: NodeOut, **READ_ERRORS})
def get_node(request: HttpRequest, name: str) -> Any:
    return node_json(named(name))


@router.post(
    "/{name}/discover", response={202: Accepted, 503: Error, **ERRORS}, auth=OperatorAuth()
)
def discover(request: HttpRequest, name: str) -> Any:
    """Queue a discovery of the node (GPUs, RAM, SGLang version) over SSH."""
    require(request, Role.OPERATOR)
    node = named(name)
    if not node.host_key:
        raise HttpError(400, f"trust {node.name}'s host key first")
    task = send("nodes.discover_node", node.pk)
    record("node.discover", actor=request.user, obj=node, request=request)
    return Status(202, {"detail": f"discovery of {node.name} queued", "id": task.id})


@router.get(
    "/{name}/gpus", response={200: dict[str, Any], 409: Error, **ERRORS}, auth=OperatorAuth()
)
def gpu_holders(request: HttpRequest, name: str) -> Any:
    """The node's GPUs now: state (free/held/quarantined), memory, holders, host memory.
    A holder of another team's team-only launch shows ``team_only`` and neither its launch nor
    its command. 409 when the node cannot be read (unreachable, host key not trusted). A worker
    reads the node (the web process never waits on SSH itself, only on that task's answer); it
    runs on the node, so it needs an operator's token (403 for a viewer's)."""
    require(request, Role.OPERATOR)
    node = named(name)
    if not node.host_key:  # nothing is run on a node nobody trusted
        return Status(409, {"detail": f"{node.name}'s host key is not trusted yet"})
    try:
        target_for(node)  # a node that may not be contacted is refused here, not by a worker
        reading = send("nodes.read_holders", node.pk).get(timeout=HOLDERS_WAIT_S)
    except ssh.RemoteError as exc:
        return Status(409, {"detail": f"{node.name} did not answer: {exc.message}"})
    except CeleryTimeout:
        return Status(409, {"detail": f"{node.name} was not read: no worker answered"})
    inspection = holders.reading_from_json(reading, node)
    if inspection is None:
        why = reading.get("error") if isinstance(reading, dict) else None
        return Status(409, {"detail": f"{node.name} did not answer: {why or 'no reading'}"})
    teams.mask_holders(request.user, inspection.holders)
    return inspection.to_json()


@router.post(
    "/{name}/cleanup", response={202: Accepted, 503: dict[str, str], **ERRORS}, auth=OperatorAuth()
)
def run_cleanup(request: HttpRequest, name: str, body: CleanupIn) -> Any:
    """Queue a cleanup of the node's GPUs; ``include_foreign`` names other holders (by PID)
    that may be killed. Follow it at ``/api/cleanups/{id}``."""
    require(request, Role.OPERATOR)
    node = named(name)
    launch = None
    if body.launch is not None:
        launch = teams.visible_launches(request.user).filter(pk=body.launch).first()
        if launch is None:
            raise HttpError(404, f"no launch #{body.launch}")
    if any(not 2 <= p <= 2**22 for p in body.include_foreign):
        raise HttpError(400, "include_foreign: process ids are 2 to 4194304")
    try:
        job = cleanup.request(
            node,
            actor=request.user,
            launch=launch,
            gpus=body.gpus,
            foreign_pids=body.include_foreign,
        )
    except cleanup.CleanupError as exc:
        raise HttpError(400, str(exc)) from None
    cleanup.queue(job)  # QueueUnavailable: 503 (the middleware), the cleanup ended as error
    return Status(202, {"detail": f"cleanup #{job.pk} queued", "id": job.pk})
