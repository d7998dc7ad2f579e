"""Reconciling: find the launches nobody works on (their worker died, their message was lost) and
queue the step each one needs again; stops whose worker died are queued again too."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from nodes.models import Launch
from nodes.models.choices import (
    LAUNCH_ACTIVE,
    LAUNCH_ENDED,
    LaunchStatus,
)
from nodes.queue import later


def stuck_stops() -> list[Launch]:
    """``stopping`` launches whose stop nobody works on: its lease went stale (its worker
    died, or its retry was lost) or it never had one."""
    stale = timezone.now() - timedelta(seconds=settings.RANKWISE_FOLLOWER_LEASE_SECONDS)
    return list(
        Launch.objects.filter(status=LaunchStatus.STOPPING).filter(
            Q(stop_beat__isnull=True) | Q(stop_beat__lt=stale)
        )
    )


def orphans() -> list[Launch]:
    """Launches nobody is working on: active, or ended with log lines still on the node, whose
    worker has not checked in within the lease."""
    stale = timezone.now() - timedelta(seconds=settings.RANKWISE_FOLLOWER_LEASE_SECONDS)
    recent = timezone.now() - timedelta(days=1)
    unfinished = Q(status__in=LAUNCH_ACTIVE) | Q(
        status__in=LAUNCH_ENDED, started__isnull=False, log_complete=False, ended__gt=recent
    )
    return list(
        Launch.objects.filter(unfinished).filter(
            Q(worker_beat__isnull=True) | Q(worker_beat__lt=stale)
        )
    )


def reconcile() -> int:
    """Queue the right task for every orphaned launch, and the stop again for every stuck
    stop (its worker died: the stop re-checks the node and finishes); returns how many."""
    found = orphans()
    for launch in found:
        if launch.status in (LaunchStatus.PENDING, LaunchStatus.PREFLIGHT):
            later("nodes.start_launch", launch.pk)
        else:
            later("nodes.follow_launch", launch.pk)
    stuck = stuck_stops()
    for launch in stuck:
        if launch.reason.startswith("stop pending"):
            # Its next attempt went with its worker (or was never queued): say what is true.
            Launch.objects.filter(pk=launch.pk, reason=launch.reason).update(
                reason=f"stop pending: {launch.node.name} unreachable at attempt "
                f"{launch.stop_attempts}; the next attempt was lost with its worker and is "
                f"queued again (attempt {launch.stop_attempts + 1})"
            )
        later("nodes.stop_launch", launch.pk)
    return len(found) + len(stuck)
