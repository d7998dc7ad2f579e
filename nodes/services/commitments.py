"""The ledger of a node: what each launch on it has committed (host memory it pins, device
memory per GPU), from its submission until its processes are gone and its memory is back.

Every budget of a launch counts the other launches on its node (``neighbours``): host RAM less
everything they committed, MemAvailable less what they committed and have not pinned yet.
Commitments are taken in the transaction that reserves the launch's GPUs and ports, with the
node's row locked, so two launches submitted at once cannot both take the same room.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from nodes.domain.budget import BudgetReport, Neighbour
from nodes.models import Commitment, Launch, Node, NodeEvent, Reservation
from nodes.models.choices import LAUNCH_ENDED


def lock(node: Node) -> None:
    """Take the node's row for the rest of the transaction: the ledger of one node changes one
    launch at a time (a row lock on PostgreSQL; SQLite's write lock does the same)."""
    Node.objects.select_for_update().filter(pk=node.pk).update(updated=timezone.now())


def active(node: Node) -> QuerySet[Commitment]:
    """The node's commitments not released yet."""
    return Commitment.objects.filter(node=node, released__isnull=True).select_related(
        "launch__revision__profile__team"
    )


def neighbours(node: Node, launch: Launch | None = None) -> tuple[Neighbour, ...]:
    """The other launches on ``node`` (all but ``launch``) with host memory committed, each
    named ``#ID (profile@N)``, or ``#ID (a team-only launch)`` for another team's own."""
    rows = active(node).exclude(launch=launch) if launch is not None else active(node)
    return tuple(
        Neighbour(label(c.launch, launch), c.host_bytes, c.pinned)
        for c in rows.order_by("launch_id")
        if c.host_bytes
    )


def label(other: Launch, seen_from: Launch | None = None) -> str:
    """How a launch is named in another launch's arithmetic, which anyone who may see that
    launch reads: its profile and revision, unless it is a team-only launch of another team."""
    profile = other.revision.profile
    team_only = profile.visibility == profile.Visibility.TEAM
    same_team = (
        seen_from is not None
        and profile.team_id is not None
        and seen_from.revision.profile.team_id == profile.team_id
    )
    if team_only and not same_team:
        return f"#{other.pk} (a team-only launch)"
    return f"#{other.pk} ({profile.name}@{other.revision.number})"


def take(launch: Launch, report: BudgetReport) -> Commitment:
    """Record (or update) what ``launch`` commits on its node by its budget: host pools per
    node, and per GPU its weights and KV pool (where both are estimated)."""
    per_gpu = _device_bytes(report)
    fields: dict[str, Any] = {
        "node": launch.node,
        "host_bytes": report.host_pool_bytes_per_node or 0,
        "device_bytes": {str(i): per_gpu for i in launch.gpus},
    }
    commitment, _ = Commitment.objects.update_or_create(launch=launch, defaults=fields)
    return commitment


def _device_bytes(report: BudgetReport) -> int | None:
    if report.weights_bytes_per_rank is None or report.device_kv_bytes_per_rank is None:
        return None
    return report.weights_bytes_per_rank + report.device_kv_bytes_per_rank


def mark_pinned(launch_id: int) -> None:
    """The launch's log showed its host pools allocated: MemAvailable counts them from now."""
    Commitment.objects.filter(launch_id=launch_id, pinned=False).update(pinned=True)


def release(launch: Launch) -> None:
    """The launch's processes are gone and its memory is back: its commitment ends."""
    Commitment.objects.filter(launch=launch, released__isnull=True).update(released=timezone.now())


def release_returned(node: Node, free: set[int], alive: Iterable[int] | None) -> list[int]:
    """A reading of ``node`` shows memory back: release what ended launches kept because it had
    not come back. Each GPU reservation on a GPU in ``free`` (idle, no process) goes, with a node
    event; each host commitment goes once its launch keeps no GPU and none of its processes is
    left (``alive``: the launch ids with a process left, as the probe saw them; None when it
    did not say, then only a launch whose kept GPUs all came back now). Returns the launch ids
    whose commitments were released."""
    kept = Reservation.objects.filter(
        node=node, kind="gpu", number__in=free, launch__status__in=LAUNCH_ENDED
    )
    back: set[int] = set()
    for r in kept:
        NodeEvent.objects.create(
            node=node,
            kind="reservation",
            message=f"GPU {r.number} released from ended launch #{r.launch_id}: its memory is free",
        )
        back.add(r.launch_id)
    kept.delete()
    held = Commitment.objects.filter(
        node=node, released__isnull=True, launch__status__in=LAUNCH_ENDED
    ).exclude(launch__reservations__kind="gpu")
    if alive is None:
        held = held.filter(launch_id__in=back)
    else:
        held = held.exclude(launch_id__in=set(alive))
    gone = list(held.values_list("launch_id", flat=True))
    Commitment.objects.filter(launch_id__in=gone).update(released=timezone.now())
    return gone
