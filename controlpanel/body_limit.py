"""Request bodies are refused past their limit before they are read whole.

Django's ASGI handler receives a request's whole body (spooling it to a temporary file) before
any view or form can look at its size, so a form's own size check comes after a 300 MiB upload
has been taken in. This middleware sits in front of Django: a ``Content-Length`` over the path's
limit is answered ``413`` without reading the body, and a body sent without one (chunked) stops
being read the moment it passes the limit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

MiB = 2**20
#: What a multipart form adds around its file (boundaries, headers, the CSRF token), in bytes.
FORM_ALLOWANCE = MiB


def limit_for(path: str, limits: Mapping[str, int], default: int) -> int:
    """The body limit (bytes) of ``path``: the longest matching prefix's in ``limits``, else
    ``default``; ``FORM_ALLOWANCE`` more is taken for the form around a file."""
    found = [prefix for prefix in limits if path.startswith(prefix)]
    return (limits[max(found, key=len)] if found else default) + FORM_ALLOWANCE


def _refusal(size: int | None, limit: int) -> tuple[Message, Message]:
    said = f"is {size / MiB:,.0f} MiB" if size is not None else "is over its limit"
    text = f"This request {said}: at most {limit / MiB:,.0f} MiB is read here. Nothing was kept.\n"
    start = {
        "type": "http.response.start",
        "status": 413,
        "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")],
    }
    return start, {"type": "http.response.body", "body": text.encode()}


class BodyLimit:
    """ASGI middleware around ``app``: see the module's docstring. ``limits`` maps a path prefix
    to its limit in bytes; every other path has ``default``."""

    def __init__(self, app: App, limits: Mapping[str, int], default: int) -> None:
        self.app, self.limits, self.default = app, dict(limits), default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = limit_for(scope.get("path", ""), self.limits, self.default)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            for message in _refusal(declared, limit - FORM_ALLOWANCE):
                await send(message)
            return
        taken = 0
        refused = False

        async def bounded_receive() -> Message:
            nonlocal taken, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                taken += len(message.get("body", b""))
                if taken > limit:
                    # Answer now and tell Django the client went: it drops what it spooled.
                    refused = True
                    for reply in _refusal(None, limit - FORM_ALLOWANCE):
                        await send(reply)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, bounded_receive, guarded_send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
