"""Celery tasks: take ids, call one service, own retries and time limits.

Long-lived work (following a launch's log and health) runs on the ``streams`` queue, served by
a thread-pool worker, so it never holds a slot that heartbeats, stops and cleanups need.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from celery import Task, shared_task
from celery.signals import worker_ready
from django.conf import settings

from nodes import ssh
from nodes.models import Launch, Node
from nodes.queue import QueueUnavailable, send
from nodes.services import holders, model_facts, notifications, test_requests
from nodes.workflows import (
    cleanup,
    diagnosing,
    discovery,
    ending,
    following,
    launching,
    reconciling,
    stamping,
)


@shared_task(name="nodes.discover_node", soft_time_limit=150, time_limit=180)
def discover_node(node_id: int) -> dict[str, Any]:
    """Discover one node; returns its facts as JSON, or ``{"error": …, "kind": …}``."""
    try:
        return discovery.discover(node_id).to_json()
    except ssh.RemoteError as exc:
        return {"error": exc.message, "kind": exc.kind}


@shared_task(name="nodes.diagnose_upload", soft_time_limit=120, time_limit=150)
def diagnose_upload(upload_id: str) -> str:
    """Read and diagnose a bundle uploaded to /diagnose/ (bounded read, off the web process)."""
    return diagnosing.diagnose_upload(upload_id)


@shared_task(name="nodes.read_model", soft_time_limit=90, time_limit=120)
def read_model(node_id: int, model_path: str) -> bool:
    """Read a model folder on a node for the budget (config.json, safetensors headers) and
    store what it found; True when the geometry is usable."""
    node = Node.objects.filter(pk=node_id).first()
    return node is not None and model_facts.read_now(node, model_path).answer is not None


@shared_task(name="nodes.read_holders", soft_time_limit=90, time_limit=120)
def read_holders(node_id: int, launch_id: int | None = None) -> dict[str, Any]:
    """Read who holds a node's GPUs (for the holders panel and the cleanup form, which poll
    for this result): ``{"node", "inspection"}``, or ``{"node", "error"}``."""
    node = Node.objects.select_related("credential").get(pk=node_id)
    launch = Launch.objects.filter(pk=launch_id, node=node).first() if launch_id else None
    try:
        return holders.reading_json(node, holders.inspect(node, launch=launch), launch)
    except ssh.RemoteError as exc:
        return {"node": node_id, "error": exc.message}


@shared_task(name="nodes.test_request", soft_time_limit=90, time_limit=120)
def test_request(launch_id: int) -> dict[str, Any]:
    """Send a ready server one short ``/generate`` (``services.test_requests.send``)."""
    launch = Launch.objects.select_related("node__credential", "revision").get(pk=launch_id)
    return test_requests.send(launch)


@shared_task(name="nodes.diagnose_launch", soft_time_limit=120, time_limit=150)
def diagnose_launch(launch_id: int) -> str | None:
    """Diagnose a failed launch from what the panel holds; its category (None: not failed)."""
    found = diagnosing.diagnose_launch(launch_id)
    return found.category if found is not None else None


@shared_task(name="nodes.stamp_launch", soft_time_limit=60, time_limit=90)
def stamp_launch(launch_id: int) -> bool:
    """Stamp a launch's revision known-good once it is due; True when it was stamped now."""
    launch = Launch.objects.select_related("node", "revision__profile").filter(pk=launch_id).first()
    return launch is not None and stamping.stamp_if_due(launch) is not None


@shared_task(name="nodes.heartbeat", soft_time_limit=60, time_limit=90, expires=60)
def heartbeat() -> int:
    """Refresh every node's live state; returns how many nodes answered."""
    return sum(o.facts is not None for o in discovery.heartbeat_sweep())


@shared_task(name="nodes.start_launch", soft_time_limit=600, time_limit=660)
def start_launch(launch_id: int) -> None:
    """Pre-flight a launch on its node and start the server if nothing blocks it."""
    launching.start(launch_id)


# A server runs for days: the global time limit must not cut its follower. The message is acked
# on receipt; a follower lost with its worker is replaced by the reconciler, not by redelivery.
FOLLOW_LIMIT_S = 365 * 24 * 3600


@shared_task(
    name="nodes.follow_launch",
    time_limit=FOLLOW_LIMIT_S,
    soft_time_limit=FOLLOW_LIMIT_S,
    acks_late=False,
)
def follow_launch(launch_id: int) -> None:
    """Follow a launch until it ended and every log line is stored (hours or days)."""
    following.follow(launch_id)


# Celery's own retry limit is off (``max_retries=None``): the chain is bounded by the
# attempts counted on the launch, which a re-queue by the reconciler continues.
@shared_task(
    bind=True, name="nodes.stop_launch", soft_time_limit=300, time_limit=360, max_retries=None
)
def stop_launch(
    self: Task[Any, Any], launch_id: int, actor_id: int | None = None
) -> dict[str, Any]:
    """Stop a launch for the user ``actor_id``; what did not come back. A node that does not
    answer gets the stop again later (backoff, bounded), until it is done or reported failed.
    """
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import AnonymousUser

    user = get_user_model().objects.filter(pk=actor_id).first() if actor_id else None
    token = self.request.id or ""
    outcome = ending.stop(launch_id, actor=user or AnonymousUser(), token=token, retries=True)
    if outcome.pending and outcome.retry_in is not None:
        try:
            retry = self.retry(countdown=outcome.retry_in, throw=False)
        except Exception as exc:  # the broker did not take the next attempt
            ending.stop_retry_lost(launch_id, token, f"{type(exc).__name__}: {exc}")
        else:
            raise retry
    return {
        "status": outcome.launch.status,
        "remaining": outcome.remaining,
        "held_gpus": {str(k): v for k, v in outcome.held_gpus.items()},
        "error": outcome.error,
    }


@shared_task(name="nodes.cleanup_gpus", soft_time_limit=1800, time_limit=1860)
def cleanup_gpus(cleanup_id: int) -> str:
    """Run a recorded GPU cleanup; its verdict."""
    return cleanup.run(cleanup_id).message


@shared_task(
    name="nodes.notify",
    autoretry_for=(OSError,),
    retry_backoff=5,
    max_retries=3,
    soft_time_limit=60,
    time_limit=90,
)
def deliver_notification(team_id: int, payload: dict[str, Any]) -> None:
    """Tell a team (webhook, e-mail) what happened; retried on network errors."""
    notifications.deliver(team_id, payload)


@shared_task(name="nodes.reconcile_launches", soft_time_limit=60, time_limit=90, expires=60)
def reconcile_launches() -> int:
    """Re-adopt launches whose worker died; returns how many were handed to a new one. Also
    ends cleanups whose worker died mid-way."""
    cleanup.expire_stale()
    return reconciling.reconcile()


@worker_ready.connect
def _reconcile_after_start(sender: Any = None, **_: Any) -> None:
    # A killed worker's leases go stale after the lease time; look once they have. A timer, not
    # a countdown task: a task held for its ETA is a message a Redis restart could strand.
    timer = threading.Timer(settings.RANKWISE_FOLLOWER_LEASE_SECONDS + 1, _queue_reconcile)
    timer.daemon = True
    timer.start()


def _queue_reconcile() -> None:
    with contextlib.suppress(QueueUnavailable):  # the beat schedule sends the next one
        send("nodes.reconcile_launches")
