"""Putting work on the task queue: the one door every view, command and service uses.

With Redis away, sending a task fails within seconds (the broker and result-store retry bounds
are in settings) and raises ``QueueUnavailable`` with a message for the user; the middleware
answers it with a 503 (JSON under ``/api/``, a page or a message for the pages).
"""

from __future__ import annotations

from typing import Any

from celery.result import AsyncResult
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

UNREACHABLE = "the task queue (Redis) is unreachable"


class QueueUnavailable(Exception):
    """The task was not queued because Redis did not answer; ``str()`` is for the user."""


def enqueue(task: str, *args: Any, **options: Any) -> AsyncResult[Any]:
    """Queue the task named ``task`` with positional ``args`` (ids, JSON values) and Celery's
    ``send_task`` ``options`` (``task_id``, ``countdown``…); its result handle.

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
