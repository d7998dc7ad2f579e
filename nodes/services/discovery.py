"""Learn a node's hardware over SSH, keep watching it, and never show a wrong inventory silently.

``discover`` runs the full probe and saves what it found (GPUs, RAM, SGLang, events for what
changed); ``heartbeat_sweep`` runs the light probe on every node in parallel, each with its own
timeout, so one dead node cannot delay the others.
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from nodes import ssh
from nodes.domain.inventory import node_status
from nodes.domain.probe_parse import (
    GpuProcess,
    NodeFacts,
    ProbeError,
    describe_changes,
    facts_from_json,
    parse_probe,
)
from nodes.models import Gpu, Node, NodeEvent
from nodes.models.choices import NodeStatus
from nodes.services import cleanup, hostkeys
from nodes.services.audit import record
from nodes.services.credentials import target_for

log = logging.getLogger(__name__)
PROBE_SOURCE = (Path(__file__).resolve().parent.parent / "remote" / "probe.py").read_bytes()
PROBE_TIMEOUT_S = 60.0
HEARTBEAT_TIMEOUT_S = 10.0
Actor = AbstractBaseUser | AnonymousUser


@dataclass(frozen=True)
class Outcome:
    """One node's probe: the facts, or the error that stopped it."""

    node_id: int
    facts: NodeFacts | None
    error: ssh.RemoteError | None


def probe(node: Node, *, live: bool = False, timeout: float = PROBE_TIMEOUT_S) -> NodeFacts:
    """Run the probe on ``node`` over SSH (a pooled connection) and parse what it printed.

    A full probe (discovery, pre-flight) first checks the node's host key in a fresh handshake,
    so nothing is learned from, or started on, a node whose key changed. The node's SGLang
    interpreter travels as one quoted argument. Raises ``ssh.RemoteError``.
    """
    if not live:
        hostkeys.verify(node, timeout=min(timeout, ssh.CONNECT_TIMEOUT_S))
    argv = ["python3", "-"] + (["--live"] if live else []) + [node.sglang_python]
    target = target_for(node)
    with ssh.pool.session(target, timeout=min(timeout, ssh.CONNECT_TIMEOUT_S)) as client:
        result = ssh.run(client, argv, stdin=PROBE_SOURCE, timeout=timeout, check=False)
    if result.exit_status == 127:
        raise ssh.RemoteError(
            "command_failed", "python3 is not installed on the node", exit_status=127
        )
    try:
        return parse_probe(result.stdout)
    except ProbeError as exc:
        tail = result.stderr.strip().splitlines()[-1:] or [""]
        raise ssh.RemoteError(
            "command_failed", f"the probe failed: {exc} {tail[0]}".strip()
        ) from None


def discover(
    node_id: int, *, actor: Actor | None = None, request: HttpRequest | None = None
) -> NodeFacts:
    """Full discovery of one node, saved; raises ``ssh.RemoteError`` after recording it."""
    node = Node.objects.select_related("credential").get(pk=node_id)
    if actor is not None:
        record("node.discover", actor=actor, obj=node, request=request)
    try:
        facts = probe(node)
    except ssh.RemoteError as exc:
        save_unreachable(node, exc)
        raise
    save_facts(node, facts)
    return facts


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
        cleanup.lift_quarantines(
            node,
            [
                {"index": g.index, "memory_used_bytes": g.memory_used_bytes,
                 "processes": list(g.processes)}
                for g in facts.gpus
            ],
        )  # fmt: skip
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
        Node.objects.filter(pk=node.pk).update(
            mem_available_bytes=facts.mem_available_bytes,
            status=status,
            status_reason=reason,
            last_seen=timezone.now(),
        )


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


def heartbeat_sweep(timeout: float = HEARTBEAT_TIMEOUT_S) -> list[Outcome]:
    """Probe every node at once (light probe), each bounded by ``timeout`` seconds; save all."""
    # Nodes without a trusted host key, or whose key changed, are not contacted at all until
    # an admin trusts one.
    nodes = list(
        Node.objects.select_related("credential")
        .exclude(host_key="")
        .exclude(status=NodeStatus.HOST_KEY_CHANGED)
    )
    if not nodes:
        return []
    started = time.monotonic()
    outcomes: dict[int, Outcome] = {}
    with ThreadPoolExecutor(max_workers=min(64, len(nodes))) as executor:
        futures = {executor.submit(_probe_quietly, n, timeout): n for n in nodes}
        done, _ = wait(futures, timeout=timeout + 2)
        for future, node in futures.items():
            if future in done:
                outcomes[node.pk] = future.result()
            else:
                error = ssh.RemoteError("timeout", f"no answer within {timeout:g} s")
                outcomes[node.pk] = Outcome(node.pk, None, error)
                with contextlib.suppress(ssh.RemoteError):
                    ssh.pool.drop(target_for(node))
        # Threads still stuck on a dead link are abandoned, not waited for.
        executor.shutdown(wait=False, cancel_futures=True)
    for node in nodes:
        outcome = outcomes[node.pk]
        if outcome.facts is not None:
            save_live(node, outcome.facts)
        elif outcome.error is not None:
            save_unreachable(node, outcome.error)
    log.info("heartbeat: %d nodes in %.2f s", len(nodes), time.monotonic() - started)
    return list(outcomes.values())


def _probe_quietly(node: Node, timeout: float) -> Outcome:
    try:
        # A fresh handshake each time: the pooled connection would not notice a changed key.
        ssh.check_host_key(target_for(node), timeout=min(timeout, ssh.CONNECT_TIMEOUT_S))
        return Outcome(node.pk, probe(node, live=True, timeout=timeout), None)
    except ssh.RemoteError as exc:
        return Outcome(node.pk, None, exc)


def offer_host_key(node: Node, *, actor: Actor, request: HttpRequest | None = None) -> ssh.HostKey:
    """Fetch the key the node presents and keep it as offered, for an admin to trust."""
    key = ssh.fetch_host_key(node.host, node.port)
    Node.objects.filter(pk=node.pk).update(
        offered_host_key=key.line, offered_host_key_fingerprint=key.fingerprint
    )
    record(
        "node.fetch_host_key",
        actor=actor,
        obj=node,
        after={"offered": key.fingerprint},
        request=request,
    )
    return key


def trust_host_key(
    node: Node, fingerprint: str, *, actor: Actor, request: HttpRequest | None = None
) -> None:
    """Trust the offered key, but only if it is the one the admin saw (``fingerprint``)."""
    if not node.offered_host_key or node.offered_host_key_fingerprint != fingerprint:
        raise ssh.RemoteError(
            "host_key_mismatch",
            "the offered host key changed since it was shown; fetch it again and compare",
            permanent=True,
        )
    before = {"trusted": node.host_key_fingerprint or None}
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(
            host_key=node.offered_host_key,
            host_key_fingerprint=fingerprint,
            offered_host_key="",
            offered_host_key_fingerprint="",
            # A changed key is settled by trusting the new one: the node is contacted again.
            status=NodeStatus.UNKNOWN if node.status != NodeStatus.MAINTENANCE else node.status,
            status_reason="host key trusted; not discovered since",
        )
        NodeEvent.objects.create(
            node=node, kind="host_key", message=f"host key {fingerprint} trusted"
        )
        record(
            "node.trust_host_key",
            actor=actor,
            obj=node,
            before=before,
            after={"trusted": fingerprint},
            request=request,
        )
