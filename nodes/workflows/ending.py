"""Ending a launch on an operator's stop: one attempt at a time, retried with bounded backoff while
the node does not answer, under a lease that lets another stop (or the reconciler) finish a stop
whose worker died."""

from __future__ import annotations

import logging
import secrets as pysecrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone

from nodes import ssh
from nodes.models import Launch
from nodes.models.choices import (
    LAUNCH_ACTIVE,
    LAUNCH_ENDED,
    LaunchStatus,
)
from nodes.services import launch_state, notifications
from nodes.services.audit import record
from nodes.services.reservations import still_reserved
from nodes.services.teardown import finish, group_members, stop_remote
from nodes.types import Actor

log = logging.getLogger(__name__)


@dataclass
class StopOutcome:
    """What a stop left behind: processes still alive, GPUs still holding memory (bytes)."""

    launch: Launch
    remaining: list[dict[str, Any]] = field(default_factory=list)
    held_gpus: dict[int, int] = field(default_factory=dict)
    error: str = ""
    # The node did not answer and the stop will be tried again (the launch stays stopping)
    # after ``retry_in`` seconds.
    pending: bool = False
    retry_in: float | None = None

    @property
    def clean(self) -> bool:
        return not self.remaining and not self.held_gpus and not self.error and not self.pending


def stop(
    launch_id: int,
    *,
    actor: Actor,
    request: HttpRequest | None = None,
    token: str = "",
    retries: bool = False,
) -> StopOutcome:
    """One attempt to stop a launch: processes gone and GPUs' memory back, or what did not
    come back.

    ``token`` names the stop (the stop task's id, the same across its retries); a stop whose
    worker died (its lease, ``stop_beat``, went stale) is taken over, so a second request or
    the reconciler finishes it, continuing its count of attempts (``Launch.stop_attempts``).
    When the node does not answer and ``retries`` is true (the caller tries again) with
    attempts left (``stop_retry_in``), the launch stays ``stopping``, its reason says when the
    next attempt is due (``outcome.pending``, ``outcome.retry_in`` seconds); with no attempt
    left, or an error retrying cannot help, the stop is reported failed and the launch gets
    back the status it had.
    """
    launch = Launch.objects.select_related("node", "revision__profile").get(pk=launch_id)
    if launch.group_id is not None:
        # One node's part of a multi-node launch: its ranks are nothing without the others',
        # so the whole launch stops.
        launch = Launch.objects.select_related("node", "revision__profile").get(pk=launch.group_id)
    token = token or pysecrets.token_hex(8)
    parts = group_members(launch, exclude=launch)
    # A stop re-queued without its asker (the reconciler, after the worker stopping it died)
    # goes on in the name of whoever asked for it.
    asker = "" if actor.is_authenticated else _asked_by([launch, *parts])
    if parts and launch.status not in LAUNCH_ENDED:
        # The launch reads ``stopping`` (audited once, as the asker's) from the start, and
        # until every node's stop is done: a node lost meanwhile no longer makes it ``lost``.
        _mark_stopping(launch, actor, request, token, asker=asker)
        launch.refresh_from_db()
    for part in parts:
        # Every node's part is stopping before any rank is signalled: a rank that dies of its
        # peers' end then fails nothing. The asker's audit entry is the launch's (node 0's).
        _mark_stopping(part, actor, None, token, asker=asker, audit=False)
    # A multi-node launch: every other node's ranks first (each its own part, its own lease),
    # node 0's last, so the launch reads stopped once every node is.
    # Node 0's lease is kept fresh meanwhile (a node that does not answer can take a minute):
    # the reconciler must not take for dead a stop that is waiting on another node.
    with _stop_lease(launch.pk, token):
        done = [
            _stop_one(
                Launch.objects.select_related("node", "revision__profile").get(pk=part.pk),
                actor,
                None,
                token,
                retries,
            )
            for part in parts
        ]
    failed = [o for o in done if o.error and not o.pending]
    if failed:
        # A node's ranks may still run: the launch as a whole was not stopped, and says so.
        outcome = _group_stop_failed(launch, failed)
    else:
        # Node 0's ranks are stopped now (they would wait on the others' for ever), but the
        # launch stays ``stopping`` while another node's stop is still to be retried.
        waiting = [o for o in done if o.pending]
        outcome = _stop_one(launch, actor, request, token, retries, waiting, asker)
    for other in done:
        outcome.remaining += [{**p, "node": other.launch.node.name} for p in other.remaining]
        if other.error:
            outcome.error = "; ".join(e for e in (outcome.error, other.error) if e)
        if other.pending:
            outcome.pending = True
            waits = [w for w in (outcome.retry_in, other.retry_in) if w is not None]
            outcome.retry_in = min(waits) if waits else None
    return outcome


def _stop_one(
    launch: Launch,
    actor: Actor,
    request: HttpRequest | None,
    token: str,
    retries: bool,
    waiting: list[StopOutcome] | None = None,
    asker: str = "",
) -> StopOutcome:
    """``stop`` of one launch (one node's part of a multi-node launch); ``waiting``: the
    other nodes' stops still pending, which node 0's launch waits on; ``asker``: who asked,
    when ``actor`` is the panel going on with their stop."""
    if launch.status in LAUNCH_ENDED:
        # Nothing to stop; what it still holds is what cleanup must free.
        return StopOutcome(launch, held_gpus=still_reserved(launch))
    marked = _mark_stopping(launch, actor, request, token, asker=asker)
    if not marked and not _take_over_stop(launch.pk, token):
        return _await_other_stop(launch, token, retries)
    launch.refresh_from_db()
    return _attempt_stop(launch, token, retries, waiting or [])


def _back_from_stopping(launch: Launch, reason: str) -> None:
    """A stop that did not happen: the launch gets back the status it had, saying why."""
    launch_state.transition(
        launch.pk,
        launch.resume_status or LaunchStatus.READY,
        frm=[LaunchStatus.STOPPING],
        actor_name=launch.stop_by or "panel",
        reason=reason,
        stop_token="",
        stop_beat=None,
    )


def _group_stop_failed(launch: Launch, failed: list[StopOutcome]) -> StopOutcome:
    """Another node's stop failed for good: node 0's launch is left running as it was (its
    stop is not done either), and its reason names the node whose stop failed."""
    names = ", ".join(o.launch.node.name for o in failed)
    why = f"stop failed on {names}: {failed[0].error}"
    if launch.status == LaunchStatus.STOPPING:  # a stop of it had begun (a retry's)
        _back_from_stopping(launch, why)
    else:
        Launch.objects.filter(pk=launch.pk).exclude(status__in=LAUNCH_ENDED).update(reason=why)
    launch.refresh_from_db()
    return StopOutcome(launch, error=why)


def _asked_by(members: list[Launch]) -> str:
    """Who asked for the stop a member of the launch is already in (``stop_by``), if any."""
    return next((m.stop_by for m in members if m.status == LaunchStatus.STOPPING and m.stop_by), "")


def _mark_stopping(
    launch: Launch,
    actor: Actor,
    request: HttpRequest | None,
    token: str,
    *,
    asker: str = "",
    audit: bool = True,
) -> bool:
    """``stopping`` under stop ``token`` (audited when ``audit``, in ``asker``'s name when
    given); False when it was not running."""
    who = asker or (actor.get_username() if actor.is_authenticated else "cli")
    stoppable = [s for s in LAUNCH_ACTIVE if s != LaunchStatus.STOPPING]
    left = launch_state.transition(
        launch.pk,
        LaunchStatus.STOPPING,
        frm=stoppable,
        actor_name=who,
        resume_status=launch.status,
        reason=f"stopping (asked by {who})",
        stop_by=who,
        stop_attempts=0,
        stop_token=token,
        stop_beat=timezone.now(),
    )
    if left is None:
        return False
    if left != launch.status:  # it moved on since it was read: resume what it really was
        Launch.objects.filter(pk=launch.pk, stop_token=token).update(resume_status=left)
    if audit and asker:
        record("launch.stop", actor=None, actor_name=asker, obj=launch, before=launch.summary())
    elif audit:
        record("launch.stop", actor=actor, obj=launch, before=launch.summary(), request=request)
    return True


def _take_over_stop(launch_id: int, token: str) -> bool:
    """Own the stop of a ``stopping`` launch: ours already (a retry), or left by a stop whose
    worker died (no check-in within the lease, or never one)."""
    stale = timezone.now() - timedelta(seconds=settings.RANKWISE_FOLLOWER_LEASE_SECONDS)
    return bool(
        Launch.objects.filter(pk=launch_id, status=LaunchStatus.STOPPING)
        .filter(Q(stop_token=token) | Q(stop_beat__isnull=True) | Q(stop_beat__lt=stale))
        .update(stop_token=token, stop_beat=timezone.now())
    )


def _attempt_stop(
    launch: Launch, token: str, retries: bool, waiting: list[StopOutcome] | None = None
) -> StopOutcome:
    attempt = launch.stop_attempts + 1
    Launch.objects.filter(pk=launch.pk).update(stop_attempts=attempt)
    with _stop_lease(launch.pk, token):
        try:
            result = stop_remote(launch)
        except ssh.RemoteError as exc:
            return _stop_not_done(launch, exc, attempt, retries)
        remaining = result.remaining
        held, notes = finish(launch, remaining)
    if waiting:
        return _waiting_on_others(launch, waiting, remaining, held)
    launch_state.transition(
        launch.pk,
        LaunchStatus.STOPPED,
        frm=[LaunchStatus.STOPPING],
        actor_name=launch.stop_by or "panel",
        reason=f"stopped by {launch.stop_by or 'the panel'}" + (f"; {notes}" if notes else ""),
        exit_status=result.status.exit_status,
        stop_token="",
        stop_beat=None,
    )
    launch.refresh_from_db()
    return StopOutcome(launch, remaining=remaining, held_gpus=held)


def _waiting_on_others(
    launch: Launch,
    waiting: list[StopOutcome],
    remaining: list[dict[str, Any]],
    held: dict[int, int],
) -> StopOutcome:
    """Node 0's ranks are stopped and another node's stop is to be retried: the launch stays
    ``stopping``, naming the node it waits on, until that stop is done (the retry comes back
    here with the same stop token and ends it)."""
    names = ", ".join(o.launch.node.name for o in waiting)
    retry_in = min((o.retry_in for o in waiting if o.retry_in is not None), default=None)
    reason = f"stopping: waiting on {names} ({waiting[0].error}); {launch.node.name} stopped"
    due = timezone.now() + timedelta(seconds=retry_in or 0)
    Launch.objects.filter(pk=launch.pk, stop_token=launch.stop_token).update(
        reason=reason, stop_beat=due
    )
    launch.refresh_from_db()
    return StopOutcome(
        launch, remaining=remaining, held_gpus=held, error=reason, pending=True, retry_in=retry_in
    )


def _stop_not_done(
    launch: Launch, exc: ssh.RemoteError, attempt: int, retries: bool
) -> StopOutcome:
    """The node did not take attempt ``attempt`` (1-based, counted across re-queues) of the
    stop: pending while attempts are left and may help, else failed (reported, audited, the
    launch back to the status it had)."""
    node = launch.node.name
    away = exc.kind in ("unreachable", "timeout")
    retry_in = stop_retry_in(attempt) if retries else None
    if retry_in is not None and away:
        pending = (
            f"stop pending: {node} unreachable ({exc.message}); retrying "
            f"(attempt {attempt + 1}) in {retry_in:g} s"
        )
        # Due again after the wait: the lease covers it, so only a lost retry goes stale.
        due = timezone.now() + timedelta(seconds=retry_in)
        Launch.objects.filter(pk=launch.pk, stop_token=launch.stop_token).update(
            reason=pending, stop_beat=due
        )
        launch.refresh_from_db()
        return StopOutcome(launch, error=pending, pending=True, retry_in=retry_in)
    why = f"{node} did not answer ({exc.message})" if away else exc.message
    failed = (
        f"stop failed after {attempt} attempt{'s' if attempt > 1 else ''}: {why}; "
        "the server may still be running"
    )
    _back_from_stopping(launch, failed)
    record(
        "launch.stop_failed",
        actor=None,
        actor_name=launch.stop_by or "panel",
        obj=launch,
        after={"attempts": attempt, "error": exc.message},
    )
    launch.refresh_from_db()
    notifications.launch_event(launch, "launch.stop_failed", failed)
    return StopOutcome(launch, error=failed)


@contextmanager
def _stop_lease(launch_id: int, token: str) -> Iterator[None]:
    """Keep the stop's lease fresh while it waits on the node (the grace period, the probe),
    so that only a stop whose worker died goes stale."""
    done = threading.Event()

    def renew() -> None:
        try:
            while not done.wait(settings.RANKWISE_FOLLOWER_LEASE_SECONDS / 3):
                Launch.objects.filter(pk=launch_id, stop_token=token).update(
                    stop_beat=timezone.now()
                )
        finally:
            connection.close()  # this thread's own connection

    thread = threading.Thread(target=renew, name=f"stop-lease-{launch_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def stop_retry_in(attempts: int) -> float | None:
    """Seconds before the stop's next attempt after ``attempts`` (≥ 1) failed ones (doubling
    from ``RANKWISE_STOP_RETRY_SECONDS``, at most two minutes); ``None`` when the chain is
    spent: at most ``RANKWISE_STOP_RETRIES`` retries after the first attempt, however often the
    stop is queued again."""
    if attempts > settings.RANKWISE_STOP_RETRIES:
        return None
    return float(min(settings.RANKWISE_STOP_RETRY_SECONDS * 2 ** max(attempts - 1, 0), 120))


def stop_retry_lost(launch_id: int, token: str, why: str) -> None:
    """The stop's next attempt could not be queued (``why``): say so, and leave the stop to
    the reconciler (its lease is dropped, so the next pass queues it again, counting on)."""
    Launch.objects.filter(pk=launch_id, status=LaunchStatus.STOPPING, stop_token=token).update(
        reason=f"stop pending: the next attempt could not be queued ({why[:200]}); it is "
        "queued again when the task queue answers",
        stop_beat=None,
    )


def _await_other_stop(launch: Launch, token: str, retries: bool) -> StopOutcome:
    """Someone else is stopping this launch: report what their stop leaves, or finish it
    when it goes stale (its worker died)."""
    deadline = time.monotonic() + settings.RANKWISE_STOP_GRACE_SECONDS + 60
    while time.monotonic() < deadline:
        launch.refresh_from_db()
        if launch.status in LAUNCH_ENDED:
            return StopOutcome(launch, held_gpus=still_reserved(launch))
        if launch.status != LaunchStatus.STOPPING:  # that stop failed; its reason says why
            return StopOutcome(launch, error=launch.reason)
        if _take_over_stop(launch.pk, token):
            launch.refresh_from_db()
            return _attempt_stop(launch, token, retries)
        if launch.reason.startswith("stop pending"):  # its own task tries again
            return StopOutcome(launch, error=launch.reason, pending=True)
        time.sleep(0.5)
    return StopOutcome(launch, error="another stop of this launch has not finished")
