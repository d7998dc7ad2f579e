"""GPU and port reservations: taken atomically when a launch is made (a unique constraint decides
between simultaneous launches), released when what they hold came back."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import Q

from nodes.domain import launch_plan as plan
from nodes.models import Launch, Node, Reservation
from nodes.services import commitments, teams


def reserve(launch: Launch, gpus: list[int], ports: list[int]) -> plan.Check:
    rows = [Reservation(node=launch.node, kind="gpu", number=g, launch=launch) for g in gpus]
    rows += [Reservation(node=launch.node, kind="port", number=p, launch=launch) for p in ports]
    try:
        with transaction.atomic():
            Reservation.objects.bulk_create(rows)
    except IntegrityError:
        held = Reservation.objects.filter(node=launch.node).filter(
            Q(kind="gpu", number__in=gpus) | Q(kind="port", number__in=ports)
        )
        # Stored on a launch anyone may see: a team-only launch is not named.
        hidden = set(
            held.filter(launch__in=teams.team_only_launches()).values_list("pk", flat=True)
        )
        what = "; ".join(
            f"{'GPU' if r.kind == 'gpu' else 'port'} {r.number} by "
            + ("a team-only launch" if r.pk in hidden else f"launch #{r.launch_id}")
            for r in held
        )
        return plan.Check("reservation", False, f"already held: {what or 'by another launch'}")
    return plan.Check(
        "reservation",
        True,
        f"GPU {', '.join(map(str, gpus))} and port {', '.join(map(str, ports))} reserved",
    )


def release(launch: Launch, *, keep_gpus: set[int] | None = None, keep_host: bool = False) -> None:
    """Free the launch's port and every GPU not in ``keep_gpus`` (memory still held), and its
    host commitment unless ``keep_host`` (processes may still pin it, or it was not read)."""
    rows = Reservation.objects.filter(launch=launch)
    if keep_gpus:
        rows = rows.exclude(kind="gpu", number__in=keep_gpus)
    rows.delete()
    if not keep_host:
        commitments.release(launch)


def still_reserved(launch: Launch) -> dict[int, int]:
    """GPUs an ended launch still holds (kept because their memory did not come back); the
    bytes are not re-read here, so they show as 0."""
    return {r.number: 0 for r in launch.reservations.filter(kind="gpu")}


def release_gpus(launch: Launch, indexes: list[int]) -> None:
    """Free the launch's reservations of GPUs ``indexes`` (their memory came back)."""
    Reservation.objects.filter(launch=launch, kind="gpu", number__in=indexes).delete()


def free_port(node: Node, wanted: int) -> int:
    """``wanted`` if no launch on ``node`` holds it, else the next port above it that none holds
    (a relaunch beside a server still running takes the next one)."""
    held = set(
        Reservation.objects.filter(node=node, kind="port", number__gte=wanted).values_list(
            "number", flat=True
        )
    )
    port = wanted
    while port in held and port < 65535:
        port += 1
    return port
