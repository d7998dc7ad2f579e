"""Role checks: viewer < operator < admin, each a Django group.

Views call these; templates never decide permissions.
"""

from __future__ import annotations

from nodes.models.choices import ROLE_ORDER, Role
from nodes.types import Actor


def role_of(user: Actor) -> Role | None:
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


def has_role(user: Actor, role: Role) -> bool:
    """True when the user holds ``role`` or a higher one."""
    held = role_of(user)
    return held is not None and ROLE_ORDER.index(held) >= ROLE_ORDER.index(role)


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
