"""The JSON API under ``/api/`` (Django Ninja): token authentication per user, the same role
rules as the pages, an OpenAPI schema at ``/api/openapi.json`` and interactive docs at
``/api/docs`` served from the package's static files (no CDN); both are public, every other
request without a valid token is answered 401 before anything else happens."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from nodes.api import cleanup, launches, nodes, profiles
from nodes.api.auth import TokenAuth

api = NinjaAPI(
    title="Rankwise",
    version="1",
    description=(
        "Operate SGLang servers on GPU nodes. Authenticate with `Authorization: Bearer <token>`"
        " (tokens are made on your account page). Viewers read; operators also launch, stop,"
        " clean up and save profile revisions. Memory is integer bytes."
    ),
    auth=TokenAuth(),
    urls_namespace="api",
)
api.add_router("/nodes", nodes.router)
api.add_router("/profiles", profiles.router)
api.add_router("/launches", launches.router)
api.add_router("/cleanups", cleanup.router)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: Exception) -> HttpResponse:
    return api.create_response(
        request, {"detail": "a valid API token is required (Authorization: Bearer …)"}, status=401
    )


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors: list[Any] = exc.errors
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", [])[1:]) or "request"
    return api.create_response(
        request, {"detail": f"{where}: {first.get('msg', 'invalid')}"}, status=422
    )


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc)}, status=exc.status_code)
