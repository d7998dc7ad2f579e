"""Audit receivers for logins, failed logins, lockouts (django-axes) and logouts; the first
admin's kept password is forgotten once it is changed."""

from __future__ import annotations

from typing import Any

from axes.signals import user_locked_out
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db.models.signals import post_save
from django.dispatch import receiver
from django.http import HttpRequest

from nodes.services import first_password
from nodes.services.audit import record


@receiver(user_logged_in)
def audit_login(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    record("auth.login", actor=user, request=request)


@receiver(user_logged_out)
def audit_logout(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    if user is not None:
        record("auth.logout", actor=user, request=request)


@receiver(user_login_failed)
def audit_login_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    # Only the user name is kept; Django has already masked anything that looks like a password.
    tried = str(credentials.get("username", ""))[:150]
    address = request.META.get("REMOTE_ADDR") if request is not None else None
    record(
        "auth.login_failed",
        actor=None,
        actor_name=tried or "anonymous",
        after={"address": address},
        request=request,
    )


@receiver(user_locked_out)
def audit_locked_out(
    sender: Any,
    request: HttpRequest | None = None,
    username: str | None = None,
    ip_address: str | None = None,
    **kwargs: Any,
) -> None:
    """Too many failures for this account from this address: this login (and each one until
    the cool-off ends) was refused whatever the password."""
    record(
        "auth.locked_out",
        actor=None,
        actor_name=str(username or "")[:150] or "anonymous",
        after={"address": ip_address, "failure_limit": settings.AXES_FAILURE_LIMIT},
        request=request,
    )


@receiver(post_save, sender=get_user_model())
def forget_first_password(sender: Any, instance: Any, **kwargs: Any) -> None:
    fields = kwargs.get("update_fields")
    if fields is None or "password" in fields:
        first_password.forget_if_changed(instance)
