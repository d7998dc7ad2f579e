"""A node whose SSH host key changed: noticed by a fresh handshake, marked, audited.

Once marked (status ``host_key_changed``) nothing is started or run there (``target_for``
refuses the node) and launches running there are left as they are, until an admin trusts the
new key (``discovery.trust_host_key``).
"""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest

from nodes import ssh
from nodes.models import Node, NodeEvent
from nodes.models.choices import NodeStatus
from nodes.services.audit import record
from nodes.services.credentials import target_for
from nodes.types import Actor


def verify(node: Node, timeout: float = ssh.CONNECT_TIMEOUT_S) -> None:
    """Check in a fresh handshake (no login, nothing run) that ``node`` presents its trusted
    key. Raises ``ssh.RemoteError``: ``host_key_mismatch`` after marking the node, or the
    reason no handshake completed (``unreachable``, ``timeout``)."""
    target = target_for(node)
    try:
        ssh.check_host_key(target, timeout)
    except ssh.RemoteError as exc:
        if exc.kind == "host_key_mismatch":
            mark_changed(node, exc)
        raise


def mark_changed(node: Node, error: ssh.RemoteError) -> None:
    """Mark ``node`` as presenting a changed host key (once: status, event, audit) and close
    this process's pooled connections to it."""
    ssh.pool.drop_host(node.host, node.port)
    with transaction.atomic():
        before = Node.objects.select_for_update().values_list("status", flat=True).get(pk=node.pk)
        if before != NodeStatus.HOST_KEY_CHANGED:
            Node.objects.filter(pk=node.pk).update(
                status=NodeStatus.HOST_KEY_CHANGED, status_reason=error.message
            )
            NodeEvent.objects.create(
                node=node,
                kind="host_key",
                message=f"{before} → {NodeStatus.HOST_KEY_CHANGED}: {error.message}",
            )
            record(
                "node.host_key_changed",
                actor=None,
                actor_name="panel",
                obj=node,
                before={"status": before, "trusted": node.host_key_fingerprint or None},
                after={"status": NodeStatus.HOST_KEY_CHANGED, "presented": error.presented or None},
            )
    node.status = NodeStatus.HOST_KEY_CHANGED
    if before != NodeStatus.HOST_KEY_CHANGED:
        node.status_reason = error.message


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
