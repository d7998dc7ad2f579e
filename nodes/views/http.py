"""What every view shares: the htmx request type, the answer after a successful POST, and the
role check (templates never decide permissions)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBase
from django.shortcuts import redirect
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

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
