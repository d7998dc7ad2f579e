"""One owner for a launch's status: which status may follow which, and the one function that
changes it.

Every status write goes through ``transition`` (a test walks the code for others): a
conditional ``UPDATE … WHERE status = <source>`` that touches the row only from a status the
table allows, sets ``ended`` when the launch enters an ended status, and leaves a
``launch.status`` audit entry. Whoever loses a race (a stop against a pre-flight refusal, two
followers) gets ``False`` and changes nothing, so a stopped launch can never become
``blocked``. A worker's lease on a launch (``claim``) lives here too: it decides who may act.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from nodes.models import Launch
from nodes.models.choices import LAUNCH_ENDED, LaunchStatus
from nodes.services.audit import record

S = LaunchStatus
#: Status → the statuses that may follow it. An ended status is final; ``lost`` is not (its
#: node may answer again). ``stopping`` goes back to the status it interrupted when the stop
#: fails (``Launch.resume_status``).
TRANSITIONS: Mapping[str, frozenset[str]] = {
    S.PENDING: frozenset({S.PREFLIGHT, S.BLOCKED, S.ERROR, S.STOPPING}),
    # PREFLIGHT → PREFLIGHT: a start re-run after its worker died takes the launch again.
    S.PREFLIGHT: frozenset({S.PREFLIGHT, S.STARTING, S.BLOCKED, S.ERROR, S.STOPPING}),
    S.STARTING: frozenset({S.LOADING, S.READY, S.FAILED, S.LOST, S.STOPPING}),
    S.LOADING: frozenset({S.READY, S.FAILED, S.LOST, S.STOPPING}),
    S.READY: frozenset({S.FAILED, S.LOST, S.STOPPING}),
    S.LOST: frozenset({S.STARTING, S.LOADING, S.READY, S.FAILED, S.STOPPING}),
    S.STOPPING: frozenset(
        {S.STOPPED, S.PENDING, S.PREFLIGHT, S.STARTING, S.LOADING, S.READY, S.LOST}
    ),
    S.STOPPED: frozenset(),
    S.BLOCKED: frozenset(),
    S.FAILED: frozenset(),
    S.ERROR: frozenset(),
}


class TransitionRefused(ValueError):
    """The code asked for a transition the table does not allow (a bug, not a race)."""


def sources(to: str) -> frozenset[str]:
    """Every status that ``to`` may follow."""
    return frozenset(s for s, after in TRANSITIONS.items() if to in after)


def allowed(current: str, to: str) -> bool:
    """True when ``to`` may follow ``current``."""
    return to in TRANSITIONS.get(current, frozenset())


def transition(
    launch_id: int,
    to: str,
    *,
    frm: Iterable[str] | None = None,
    where: Mapping[str, Any] | None = None,
    actor_name: str = "panel",
    **fields: Any,
) -> str | None:
    """Move launch ``launch_id`` to status ``to`` from one of ``frm`` (default: every status
    the table allows before ``to``), only while its row also matches ``where`` (e.g. the
    worker's lease); other columns in ``fields`` are written in the same UPDATE, and ``ended``
    is set when ``to`` is an ended status.

    Returns the status the launch left, or ``None`` when it was in none of them (someone else
    moved it first: nothing was written). Raises ``TransitionRefused`` when ``frm`` names a
    status that ``to`` may not follow.
    """
    wanted = sources(to) if frm is None else frozenset(frm)
    if refused := sorted(s for s in wanted if not allowed(s, to)):
        raise TransitionRefused(f"a launch cannot go from {', '.join(refused)} to {to}")
    if to in LAUNCH_ENDED:
        fields.setdefault("ended", timezone.now())
    rows = Launch.objects.filter(pk=launch_id, **dict(where or {}))
    # One conditional UPDATE per source, so that the status left is known exactly on every
    # database (a read before the write could race).
    for source in sorted(wanted):
        if rows.filter(status=source).update(status=to, **fields):
            if source != to:
                _audit(launch_id, source, to, actor_name)
            return source
    return None


def _audit(launch_id: int, source: str, to: str, actor_name: str) -> None:
    launch = Launch.objects.filter(pk=launch_id).first()
    record(
        "launch.status",
        actor=None,
        actor_name=actor_name,
        obj=launch,
        before={"status": source},
        after={"status": to},
    )


def claim(launch_id: int, token: str, statuses: Iterable[str]) -> bool:
    """Take the launch's lease (``worker_token``/``worker_beat``) if it is free, stale or
    already ``token``'s, while its status is one of ``statuses``: the one worker that may act
    on it. The lease goes stale ``RANKWISE_FOLLOWER_LEASE_SECONDS`` after the last beat."""
    stale = timezone.now() - timedelta(seconds=settings.RANKWISE_FOLLOWER_LEASE_SECONDS)
    return bool(
        Launch.objects.filter(pk=launch_id, status__in=list(statuses))
        .filter(Q(worker_beat__isnull=True) | Q(worker_beat__lt=stale) | Q(worker_token=token))
        .update(worker_token=token, worker_beat=timezone.now())
    )


def known_good_due(launch: Launch) -> bool:
    """Ready, healthy at the last check, and ready for at least the known-good window
    (``RANKWISE_KNOWN_GOOD_SECONDS``): time to stamp its revision known-good."""
    if launch.status != LaunchStatus.READY or launch.ready_at is None:
        return False
    window = timedelta(seconds=settings.RANKWISE_KNOWN_GOOD_SECONDS)
    return timezone.now() >= launch.ready_at + window and launch.health_at is not None


def release_lease(launch_id: int, token: str) -> None:
    """Give up ``token``'s lease on the launch (nothing happens when another holds it)."""
    Launch.objects.filter(pk=launch_id, worker_token=token).update(
        worker_token="", worker_beat=None
    )
