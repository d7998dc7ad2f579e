"""What every view shares: the htmx request type, the answer after a successful POST, the role
check (templates never decide permissions), and where a reading queued for a worker stands
(pages never wait on a node: they poll)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBase
from django.shortcuts import redirect
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from nodes import queue
from nodes.models.choices import Role
from nodes.services.roles import has_role


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def after_post(request: HtmxHttpRequest, url: str) -> HttpResponseBase:
    """After a successful POST: a client redirect for htmx, a plain 302 otherwise."""
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return redirect(url)


View = Callable[..., HttpResponseBase]


def role_required(role: Role) -> Callable[[View], View]:
    """Decorate a view: anonymous users go to the login page, users below ``role`` get 403."""

    def decorator(view: View) -> View:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not has_role(request.user, role):
                raise PermissionDenied(f"This needs the {role.label.lower()} role.")
            return view(request, *args, **kwargs)

        return login_required(wrapped)

    return decorator


TASK_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class TaskState:
    """Where a queued reading stands: still ``running``, done with its ``result``, or
    ``error`` (the task crashed, Redis does not answer)."""

    id: str
    running: bool
    result: Any = None
    error: str | None = None


def task_state(task_id: str, what: str) -> TaskState | None:
    """The state of the task ``task_id`` (None for text that is not a task id); ``what`` names
    the task in its error ("the discovery task crashed…")."""
    if not TASK_ID.fullmatch(task_id):
        return None
    result = queue.result(task_id)
    try:
        if not result.ready():
            return TaskState(task_id, running=True)
        if result.failed():
            return TaskState(task_id, False, error=f"the {what} task crashed; see the worker's log")
        return TaskState(task_id, False, result=result.result)
    except (OperationalError, RedisError):
        return TaskState(task_id, False, error="the task queue (Redis) does not answer")
