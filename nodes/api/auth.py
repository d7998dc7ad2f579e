"""Bearer tokens, and the role a call needs."""

from __future__ import annotations

from typing import Any, cast

from django.http import HttpRequest
from ninja.errors import HttpError
from ninja.security import HttpBearer

from nodes.models.choices import Role
from nodes.services import tokens
from nodes.services.roles import has_role


class TokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        user = tokens.user_for(token)
        if user is not None:
            request.user = cast(Any, user)  # what the pages' role checks read
        return user


def require(request: HttpRequest, role: Role) -> None:
    """403 unless the token's user holds ``role`` (or a higher one)."""
    if not has_role(request.user, role):
        raise HttpError(403, f"this needs the {role.label.lower()} role")


class OperatorAuth(TokenAuth):
    """A valid token of an operator (or admin): a viewer's is refused (403) before the request
    body is even read, so a change a viewer asks for fails the same way whatever it holds."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        user = super().authenticate(request, token)
        if user is not None and not has_role(user, Role.OPERATOR):
            raise HttpError(403, "this needs the operator role")
        return user
