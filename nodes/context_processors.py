"""Template context: the user's role, so pages can hide buttons they could not use anyway.

Hiding is a courtesy only; every mutating view checks the role itself.
"""

from __future__ import annotations

from django.http import HttpRequest

from nodes.models.choices import Role
from nodes.services.roles import has_role, role_of


def roles(request: HttpRequest) -> dict[str, object]:
    user = request.user
    return {
        "user_role": role_of(user),
        "can_operate": has_role(user, Role.OPERATOR),
        "can_admin": has_role(user, Role.ADMIN),
    }
