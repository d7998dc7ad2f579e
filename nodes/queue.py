"""Putting work on the task queue: the one door every view, command, service and workflow uses.

Tasks are named, never imported (``"nodes.start_launch"``), so nothing below the task layer
imports ``nodes.tasks``. ``enqueue`` sends once the current transaction commits (at once outside
one), so a worker never looks for a row that is not there yet; ``send`` sends now.

With Redis away, sending a task fails within seconds (the broker and result-store retry bounds
are in settings) and raises ``QueueUnavailable`` with a message for the user; the middleware
answers it with a 503 (JSON under ``/api/``, a page or a message for the pages).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.result import AsyncResult
from django.db import transaction
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

log = logging.getLogger(__name__)
UNREACHABLE = "the task queue (Redis) is unreachable"


class QueueUnavailable(Exception):
    """The task was not queued because Redis did not answer; ``str()`` is for the user."""


def send(task: str, *args: Any, **options: Any) -> AsyncResult[Any]:
    """Queue the task named ``task`` now, with positional ``args`` (ids, JSON values) and
    Celery's ``send_task`` ``options`` (``task_id``, ``countdown``…); its result handle.

    Raises ``QueueUnavailable`` when Redis does not take it (nothing was queued then).
    """
    from controlpanel.celery import app

    try:
        return app.send_task(task, args=list(args), **options)
    except (OperationalError, RedisError, OSError) as exc:
        raise QueueUnavailable(f"{UNREACHABLE}: {exc}") from exc
    except RuntimeError as exc:
        # Celery's result store wraps its last connection error when it gives up reconnecting.
        if isinstance(exc.__cause__, (RedisError, OSError)):
            raise QueueUnavailable(f"{UNREACHABLE}: {exc.__cause__}") from exc
        raise


def result(task_id: str) -> AsyncResult[Any]:
    """The handle of the task ``task_id`` on the panel's own Celery app (its result store)."""
    from controlpanel.celery import app

    return AsyncResult(task_id, app=app)


Unavailable = Callable[[QueueUnavailable], None]


def enqueue(task: str, *args: Any, unavailable: Unavailable | None = None, **options: Any) -> None:
    """Queue ``task`` (as ``send``) once the current transaction commits, at once outside one.

    When Redis does not take it, ``unavailable(error)`` is called (it may record what that
    means and re-raise); without it ``QueueUnavailable`` propagates from the commit.
    """

    def now() -> None:
        try:
            send(task, *args, **options)
        except QueueUnavailable as exc:
            if unavailable is None:
                raise
            unavailable(exc)

    transaction.on_commit(now)


def later(task: str, *args: Any, **options: Any) -> None:
    """Queue ``task`` after commit for work the reconciler would redo anyway: a broker away
    only logs a warning (the next reconciler pass queues it again)."""

    def warn(exc: QueueUnavailable) -> None:
        log.warning("could not queue %s%r (%s); the reconciler will", task, args, exc)

    enqueue(task, *args, unavailable=warn, **options)
