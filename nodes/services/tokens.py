"""API tokens: made with ``secrets``, kept as SHA-256 digests, shown to their owner once."""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest
from django.utils import timezone

from nodes.models import ApiToken
from nodes.services.audit import record

PREFIX = "rw_"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create(user: AbstractBaseUser, name: str, request: HttpRequest | None = None) -> str:
    """A new token for ``user``; the only time its value exists outside the user's hands."""
    token = PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(
        user_id=user.pk, name=name.strip() or "token", prefix=token[:10], digest=digest(token)
    )
    record("token.create", actor=user, obj=row, after={"name": row.name}, request=request)
    return token


def revoke(user: AbstractBaseUser, pk: int, request: HttpRequest | None = None) -> bool:
    updated = ApiToken.objects.filter(pk=pk, user_id=user.pk, revoked__isnull=True).update(
        revoked=timezone.now()
    )
    if updated:
        row = ApiToken.objects.get(pk=pk)
        record("token.revoke", actor=user, obj=row, before={"name": row.name}, request=request)
    return bool(updated)


def user_for(token: str) -> AbstractBaseUser | None:
    """The active user a live token belongs to, or ``None``."""
    if not token.startswith(PREFIX) or len(token) > 200:
        return None
    row = (
        ApiToken.objects.select_related("user")
        .filter(digest=digest(token), revoked__isnull=True)
        .first()
    )
    if row is None or not row.user.is_active:
        return None
    ApiToken.objects.filter(pk=row.pk).update(last_used=timezone.now())
    return row.user
