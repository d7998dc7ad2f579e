"""Changes to the node inventory, each in one transaction with its audit entry."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import transaction
from django.http import HttpRequest

from nodes.models import Node, NodeEvent
from nodes.models.choices import NodeStatus
from nodes.services.audit import record
from nodes.types import Actor


class UnknownNode(LookupError):
    """No node has this name (``args[0]``)."""


def nodes_named(names: Sequence[str]) -> list[Node]:
    """The nodes of ``names``, in that order (a multi-node launch's: node 0 first), in one
    query; raises ``UnknownNode`` with the first name no node has."""
    found = {n.name: n for n in Node.objects.filter(name__in=names)}
    if missing := [n for n in names if n not in found]:
        raise UnknownNode(missing[0])
    return [found[n] for n in names]


def save_node(
    write: Callable[[], Node],
    *,
    before: dict[str, Any] | None,
    actor: Actor,
    request: HttpRequest | None = None,
) -> Node:
    """Run ``write`` (it saves the node and its GPUs: a valid ``NodeForm``'s ``save``) and record
    ``node.create`` (``before`` is None) or ``node.update`` with ``before`` (the node's
    ``audit_snapshot()`` as it was) and after.

    Either both the node (with its GPUs) and the audit entry are written, or neither is.
    """
    with transaction.atomic():
        node = write()
        after = node.audit_snapshot()
        if before == after:
            return node
        record(
            "node.update" if before else "node.create",
            actor=actor,
            obj=node,
            before=before,
            after=after,
            request=request,
        )
    return node


def set_maintenance(
    node: Node, on: bool, *, actor: Actor, request: HttpRequest | None = None
) -> None:
    """Take a node out of service (no launches) or put it back; the next probe sets its status.

    A node whose host key changed stays so: only trusting the new key settles that.
    """
    if node.status == NodeStatus.HOST_KEY_CHANGED:
        return
    before = {"status": node.status}
    status = NodeStatus.MAINTENANCE if on else NodeStatus.UNKNOWN
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(status=status)
        NodeEvent.objects.create(
            node=node, kind="status", message=f"{node.status} → {status} (set by {actor})"
        )
        record(
            "node.maintenance",
            actor=actor,
            obj=node,
            before=before,
            after={"status": status},
            request=request,
        )


def delete_node(node: Node, *, actor: Actor, request: HttpRequest | None = None) -> None:
    """Delete a node and its GPU rows, recording ``node.delete`` with what was removed."""
    with transaction.atomic():
        before = node.audit_snapshot()
        record("node.delete", actor=actor, obj=node, before=before, request=request)
        node.delete()
