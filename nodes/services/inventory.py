"""Changes to the node inventory, each in one transaction with its audit entry."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.http import HttpRequest

from nodes.forms.inventory import NodeForm
from nodes.models import Node, NodeEvent
from nodes.models.choices import NodeStatus
from nodes.services.audit import record

Actor = AbstractBaseUser | AnonymousUser


def save_node(form: NodeForm, *, actor: Actor, request: HttpRequest | None = None) -> Node:
    """Save a valid ``NodeForm`` and record ``node.create`` or ``node.update`` with before/after.

    Either both the node (with its GPUs) and the audit entry are written, or neither is.
    """
    before = form.snapshot_before
    with transaction.atomic():
        node = form.save()
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
