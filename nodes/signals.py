"""Audit receivers for logins, failed logins and logouts."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.dispatch import receiver
from django.http import HttpRequest

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
    record("auth.login_failed", actor=None, actor_name=tried or "anonymous", request=request)
