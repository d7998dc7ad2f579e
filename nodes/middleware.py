"""Request ids: every request gets one, audit entries carry it, responses echo it. Requests
refused before a view reads them (NUL in the API) or whose task could not be queued."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from django.contrib import messages
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from nodes.queue import QueueUnavailable

_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RequestIdMiddleware:
    """Take a sane ``X-Request-ID`` from a proxy, else make one: ``request.request_id``."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-ID", "")
        request_id = incoming if _SAFE_ID.fullmatch(incoming) else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        response = self.get_response(request)
        response["X-Request-ID"] = request_id
        return response


class ApiNulMiddleware:
    """The API refuses NUL characters in bodies and queries (PostgreSQL text cannot hold them)
    with a 400 before any view reads them; the pages' forms refuse them field by field."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/") and (
            "%00" in request.META.get("QUERY_STRING", "")
            or "\x00" in request.path
            or (request.method in ("POST", "PUT", "PATCH") and _nul_in_body(request))
        ):
            return JsonResponse({"detail": "NUL characters are not accepted"}, status=400)
        return self.get_response(request)


def _nul_in_body(request: HttpRequest) -> bool:
    try:
        body = request.body
    except RequestDataTooBig:
        return False  # Django answers that itself
    return b"\\u0000" in body or b"\x00" in body


class QueueUnavailableMiddleware:
    """A task the request wanted queued could not be (Redis is away): answer 503 at once with
    a plain message instead of an error page, JSON under ``/api/``."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, QueueUnavailable):
            return None
        detail = f"{exception}; nothing was done, try again once it is back"
        if request.path.startswith("/api/"):
            return JsonResponse({"detail": detail}, status=503)
        if getattr(request, "htmx", False):
            # htmx does not swap an error answer: reload the page, which shows the message.
            messages.error(request, detail[:1].upper() + detail[1:] + ".")
            return HttpResponse(status=503, headers={"HX-Refresh": "true"})
        return render(request, "503.html", {"detail": detail}, status=503)
