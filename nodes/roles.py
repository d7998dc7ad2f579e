"""Role checks: viewer < operator < admin, each a Django group.

Views call these; templates never decide permissions.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBase

from nodes.models.choices import ROLE_ORDER, Role


def role_of(user: AbstractBaseUser | AnonymousUser) -> Role | None:
    """The highest role the user holds; superusers are admins; ``None`` for no role."""
    if not user.is_authenticated or not user.is_active:
        return None
    if getattr(user, "is_superuser", False):
        return Role.ADMIN
    # Cached on the user object: one query per request however often a page asks.
    cached: Role | None | str = getattr(user, "_rankwise_role", "unset")
    if cached != "unset":
        return cached  # type: ignore[return-value]
    names = set(user.groups.values_list("name", flat=True))  # type: ignore[attr-defined]
    held = [role for role in ROLE_ORDER if role.value in names]
    role = held[-1] if held else None
    setattr(user, "_rankwise_role", role)  # noqa: B010
    return role


def has_role(user: AbstractBaseUser | AnonymousUser, role: Role) -> bool:
    """True when the user holds ``role`` or a higher one."""
    held = role_of(user)
    return held is not None and ROLE_ORDER.index(held) >= ROLE_ORDER.index(role)


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


def ensure_roles() -> None:
    """Create the three role groups and the built-in ``cli`` admin account, if missing.

    Runs after every ``migrate`` (and after a flush), like Django's own permission set-up. The
    ``cli`` account has no usable password: it cannot log in over the web, only act for a shell
    on the panel host.
    """
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    groups = {role: Group.objects.get_or_create(name=role.value)[0] for role in ROLE_ORDER}
    cli, created = get_user_model().objects.get_or_create(username=settings.RANKWISE_CLI_USER)
    if created:
        cli.set_unusable_password()
        cli.save(update_fields=["password"])
    cli.groups.add(groups[Role.ADMIN])
