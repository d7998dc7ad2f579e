"""The one helper every mutating path calls to leave an ``AuditEntry``."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import models
from django.http import HttpRequest

from nodes.models import AuditEntry
from nodes.types import Actor


def record(
    action: str,
    *,
    actor: Actor | None,
    obj: models.Model | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    request: HttpRequest | None = None,
    actor_name: str | None = None,
) -> AuditEntry:
    """Write one audit entry and return it.

    ``action`` is a dotted verb such as ``"node.create"``. ``before``/``after`` are JSON-ready
    snapshots (``None`` for a creation's before or a deletion's after). ``actor_name`` overrides the
    recorded name, for actions without a user (a failed login names the user name tried).
    """
    user = actor if isinstance(actor, AbstractBaseUser) else None
    return AuditEntry.objects.create(
        actor=user,  # type: ignore[misc]
        actor_name=actor_name or (user.get_username() if user else "anonymous"),
        action=action,
        object_type=obj._meta.model_name or "" if obj is not None else "",
        object_id=str(obj.pk) if obj is not None else "",
        object_repr=str(obj)[:200] if obj is not None else "",
        before=before,
        after=after,
        request_id=getattr(request, "request_id", "") if request is not None else "",
    )
