"""Reading a node: the agent's probe over a pooled connection, and storing what it found (GPU
rows, facts, status, events for what changed) or that it did not answer."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from django.db import transaction
from django.utils import timezone

from nodes import ssh
from nodes.domain.inventory import node_status
from nodes.domain.probe_parse import (
    GpuProcess,
    NodeFacts,
    describe_changes,
    facts_from_json,
)
from nodes.models import (
    Gpu,
    Launch,
    Node,
    NodeEvent,
)
from nodes.models.choices import (
    LAUNCH_ENDED,
    NodeStatus,
)
from nodes.remote import client as agent
from nodes.services import commitments, hostkeys, quarantines
from nodes.services.credentials import target_for

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 60.0


def probe(node: Node, *, live: bool = False, timeout: float = PROBE_TIMEOUT_S) -> NodeFacts:
    """Run the agent's probe on ``node`` over a pooled connection; what it found.

    A full probe (discovery, pre-flight) first checks the node's host key in a fresh handshake,
    so nothing is learned from, or started on, a node whose key changed. The node's SGLang
    interpreter travels as one quoted argument. Raises ``ssh.RemoteError``.
    """
    if not live:
        hostkeys.verify(node, timeout=min(timeout, ssh.CONNECT_TIMEOUT_S))
    target = target_for(node)
    with ssh.pool.session(target, timeout=min(timeout, ssh.CONNECT_TIMEOUT_S)) as conn:
        return agent.probe(conn, node.sglang_python, live=live, timeout=timeout)


def gpus_json(facts: NodeFacts) -> list[dict[str, Any]]:
    """The GPUs of a probe as JSON (``index``, ``memory_total_bytes``, ``memory_used_bytes``,
    ``processes``: ``pid``, ``name``, ``used_memory_bytes``), as snapshots and holders keep them."""
    return [
        {
            "index": g.index,
            "memory_total_bytes": g.memory_total_bytes,
            "memory_used_bytes": g.memory_used_bytes,
            "processes": [
                {"pid": p.pid, "name": p.name, "used_memory_bytes": p.used_memory_bytes}
                for p in g.processes
            ],
        }
        for g in facts.gpus
    ]


def save_facts(node: Node, facts: NodeFacts) -> None:
    """Store a full probe: GPU rows replaced, facts kept, changes and status turns as events."""
    old = _stored_facts(node)
    with transaction.atomic():
        _refresh_status(node)
        status, reason = node_status(
            reachable=True,
            maintenance=node.status == NodeStatus.MAINTENANCE,
            problems=facts.problems,
        )
        node.gpus.all().delete()
        Gpu.objects.bulk_create(
            Gpu(
                node=node,
                index=g.index,
                name=g.name,
                uuid=g.uuid,
                memory_total_bytes=g.memory_total_bytes,
                memory_used_bytes=g.memory_used_bytes,
                processes=[_process_json(p) for p in g.processes],
            )
            for g in facts.gpus
        )
        quarantines.lift_quarantines(node, _gpu_docs(facts))
        commitments.release_returned(
            node, quarantines.free_gpus(_gpu_docs(facts)), facts.live_launches
        )
        now = timezone.now()
        for change in describe_changes(old, facts):
            NodeEvent.objects.create(node=node, kind="change", message=change)
        _status_event(node, status, reason)
        Node.objects.filter(pk=node.pk).update(
            host_ram_bytes=facts.host_ram_bytes,
            mem_available_bytes=facts.mem_available_bytes,
            sglang_version=facts.sglang_version or "",
            facts=facts.to_json(),
            status=status,
            status_reason=reason,
            last_seen=now,
            last_discovered=now,
        )


def save_live(node: Node, facts: NodeFacts) -> None:
    """Store a heartbeat: GPU memory in use and MemAvailable; the status from what is known."""
    stored = _stored_facts(node)
    lasting = [p for p in (stored.problems if stored else ()) if not p.startswith("GPUs not")]
    by_index = {g.index: g for g in facts.gpus}
    with transaction.atomic():
        _refresh_status(node)
        status, reason = node_status(
            reachable=True,
            maintenance=node.status == NodeStatus.MAINTENANCE,
            problems=[*facts.problems, *lasting],
        )
        rows = list(node.gpus.all())
        for row in rows:
            live = by_index.get(row.index)
            row.memory_used_bytes = live.memory_used_bytes if live else None
            row.processes = [_process_json(p) for p in live.processes] if live else []
        Gpu.objects.bulk_update(rows, ["memory_used_bytes", "processes"])
        _status_event(node, status, reason)
        _escaped_events(node, facts)
        if facts.gpus_detected:  # a reading that could not see the GPUs shows nothing back
            commitments.release_returned(
                node, quarantines.free_gpus(_gpu_docs(facts)), facts.live_launches
            )
        Node.objects.filter(pk=node.pk).update(
            mem_available_bytes=facts.mem_available_bytes,
            status=status,
            status_reason=reason,
            last_seen=timezone.now(),
        )


def _gpu_docs(facts: NodeFacts) -> list[dict[str, Any]]:
    return [
        {"index": g.index, "memory_used_bytes": g.memory_used_bytes, "processes": list(g.processes)}
        for g in facts.gpus
    ]


def _escaped_events(node: Node, facts: NodeFacts) -> None:
    """A node event, once, for each process of an ended launch still holding a GPU: it escaped
    its launch's end (re-parented to PID 1, say, when its server was killed)."""
    held = {
        (g.index, p.pid, p.launch_id)
        for g in facts.gpus
        for p in g.processes
        if p.launch_id is not None
    }
    ended = dict(
        Launch.objects.filter(
            pk__in={launch for _, _, launch in held}, status__in=LAUNCH_ENDED
        ).values_list("pk", "status")
    )
    for index, pid, launch in sorted(h for h in held if h[2] in ended):
        message = (
            f"GPU {index}: PID {pid} of launch #{launch} ({ended[launch]}) still holds memory: "
            "it escaped its launch's end; clean up the GPU"
        )
        if not NodeEvent.objects.filter(node=node, kind="escaped", message=message).exists():
            NodeEvent.objects.create(node=node, kind="escaped", message=message)


def save_unreachable(node: Node, error: ssh.RemoteError) -> None:
    """The node did not answer (or refused us): say so, keep last-seen as it was.

    A node whose host key nobody trusted yet is not unreachable: it stays ``unknown``; one that
    presents another key than the trusted one is marked ``host_key_changed``.
    """
    if error.kind == "host_key_mismatch":
        hostkeys.mark_changed(node, error)
        return
    with transaction.atomic():
        _refresh_status(node)
        if node.status == NodeStatus.MAINTENANCE:
            status = NodeStatus.MAINTENANCE
        elif error.kind == "host_key_unknown":
            status = NodeStatus.UNKNOWN
        else:
            status = NodeStatus.UNREACHABLE
        _status_event(node, status, error.message)
        Node.objects.filter(pk=node.pk).update(status=status, status_reason=error.message)


def _refresh_status(node: Node) -> None:
    """Re-read the status under a row lock: an admin may have set maintenance while we probed."""
    node.status = Node.objects.select_for_update().values_list("status", flat=True).get(pk=node.pk)


def _status_event(node: Node, status: str, reason: str) -> None:
    if status != node.status:
        message = f"{node.status} → {status}" + (f": {reason}" if reason else "")
        NodeEvent.objects.create(node=node, kind="status", message=message)


def _stored_facts(node: Node) -> NodeFacts | None:
    if not node.facts:
        return None
    try:
        return facts_from_json(node.facts)
    except (KeyError, TypeError, ValueError):
        return None


def _process_json(process: GpuProcess) -> dict[str, object]:
    return asdict(process)
