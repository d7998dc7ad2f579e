"""A launch's log for the viewer: windows of stored lines by sequence number, search over all of
them, the whole log as a download, and the live stream.

The live stream is Server-Sent Events. It replays stored lines after ``Last-Event-ID`` (or
``?after=``) from the database, then relays what the follower publishes on the launch's Redis
channel: the lines themselves, published before their batch is committed, so a line reaches the
browser without waiting for the database. Sequence numbers keep it exact: a published batch that
does not follow the last line sent (a message missed, a reconnect) is read from the database,
which by then holds every batch before it (the follower commits one before publishing the
next). Without Redis it reads the database every half-second.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseNotAllowed,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET
from redis.exceptions import RedisError

from nodes.domain.log_lines import with_node
from nodes.live import channel
from nodes.models import Launch, LaunchLogLine
from nodes.models.choices import LAUNCH_ENDED
from nodes.services import bundles, log_view
from nodes.services.teams import visible_launches

#: Lines one event or poll carries at most.
BATCH = 1000
#: A search needs this many characters (fewer would match most lines of a long log).
SEARCH_MIN = 2
SEARCH_MAX = 200


def _seen(request: HttpRequest) -> Any:
    return visible_launches(request.user)


#: A line's sequence number is below this (the column is a 32-bit integer).
SEQ_END = 2**31
#: The stream checks this often that its viewer may still see the launch (a profile made
#: team-only while its page is open stops the stream within this many seconds).
RECHECK_S = 5.0


class BadNumber(ValueError):
    """A query parameter that should be a number and is not one; the message says which."""


def _seq(text: str | None, name: str, low: int = 0, high: int = SEQ_END - 1) -> int | None:
    """A number from a query parameter or header (ASCII digits, ``low`` … ``high``), ``None``
    when absent. Raises ``BadNumber`` for anything else."""
    if text is None:
        return None
    if not re.fullmatch(r"[0-9]{1,10}", text) or not low <= int(text) <= high:
        raise BadNumber(f"{name} is a whole number from {low:,} to {high:,}")
    return int(text)


def _no_launch() -> JsonResponse:
    return JsonResponse({"error": "No such launch."}, status=404)


def _done(launch: Launch) -> bool:
    return launch.status in LAUNCH_ENDED and (launch.log_complete or not launch.started)


@require_GET
@login_required
def launch_lines(request: HttpRequest, pk: int) -> JsonResponse:
    """Stored lines as ``[seq, text, level, rank, node]`` (level 0 information, 1 warning, 2
    error; ``node`` the name of the node that printed it in a multi-node launch, else ``""``):
    after ``?after=SEQ`` (the live stream's polling fallback), before ``?before=SEQ`` (scrolling
    back), around ``?around=SEQ`` (a jump to a line or a match), or the last ones; at most
    ``?limit=`` (1,000). ``?level=warning|error``, ``?rank=TP3``, ``?node=NAME`` and
    ``?evidence=1`` filter.
    400 with ``error`` for a filter or number it does not take, or more than one of
    ``after``, ``before`` and ``around``; 404 with ``error`` for a launch the user may not see."""
    launch = _seen(request).filter(pk=pk).first()
    if launch is None:
        return _no_launch()
    try:
        filters = log_view.Filters.of(request.GET)
        edges = {k: _seq(request.GET.get(k), k) for k in ("after", "before", "around")}
        limit = _seq(request.GET.get("limit"), "limit", 1, BATCH) or BATCH
    except (log_view.BadFilter, BadNumber) as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    if sum(v is not None for v in edges.values()) > 1:
        return JsonResponse({"error": "give one of after, before and around"}, status=400)
    found = log_view.window(launch, **edges, limit=limit, filters=filters)
    return JsonResponse(
        {
            "lines": found.rows,
            "more_before": found.more_before,
            "more_after": found.more_after,
            "status": launch.status,
            "last_seq": launch.last_seq,
            "ended": _done(launch),
        }
    )


@require_GET
@login_required
def launch_search(request: HttpRequest, pk: int) -> JsonResponse:
    """Stored lines containing ``?q=`` (case-insensitive, 2–200 characters), with the viewer's
    filters: ``{"count", "capped", "matches": [[seq, text, level, rank, node], …], "more"}`` (the
    first 200 in order; the count goes to 100,000; ``more``: matches follow the listed ones).
    With ``?after=SEQ`` the next 200 after line SEQ, as ``{"matches", "more"}``. 400 with
    ``error`` for a search it does not take; 404 with ``error`` for a launch the user may not
    see."""
    launch = _seen(request).filter(pk=pk).first()
    if launch is None:
        return _no_launch()
    text = request.GET.get("q", "")
    if not SEARCH_MIN <= len(text) <= SEARCH_MAX:
        return JsonResponse(
            {"error": f"search for {SEARCH_MIN} to {SEARCH_MAX} characters"}, status=400
        )
    if "\x00" in text:
        return JsonResponse({"error": "a search cannot hold a NUL character"}, status=400)
    try:
        filters = log_view.Filters.of(request.GET)
        after = _seq(request.GET.get("after"), "after")
    except (log_view.BadFilter, BadNumber) as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    if after is not None:
        rows, more = log_view.matches_after(launch, text, after, filters)
        return JsonResponse({"matches": rows, "more": more})
    count, matches = log_view.search(launch, text, filters)
    return JsonResponse(
        {
            "count": count,
            "matches": matches,
            "capped": count >= log_view.COUNT_MAX,
            "more": count > len(matches),
        }
    )


@require_GET
@login_required
def launch_log(request: HttpRequest, pk: int) -> HttpResponseBase:
    """The whole log as text: the archive when lines were dropped from the database. A
    multi-node launch's lines each start with ``[NODE] ``, the name of the node that printed it."""
    launch = get_object_or_404(_seen(request), pk=pk)
    name = f"launch-{launch.pk}.log"
    if launch.log_archive:
        response: HttpResponseBase = StreamingHttpResponse(
            bundles.archived_log(launch), content_type="text/plain; charset=utf-8"
        )
    else:

        def lines() -> Iterator[str]:
            query = launch.lines.order_by("seq").values_list("seq", "text", "node")
            previous = 0
            for seq, text, node in query.iterator(chunk_size=5000):
                if seq != previous + 1:
                    yield f"[rankwise: lines {previous + 1}–{seq - 1} were not kept]\n"
                previous = seq
                yield with_node(text, node) + "\n"
            if previous < launch.last_seq:
                yield f"[rankwise: lines {previous + 1}–{launch.last_seq} were not kept]\n"

        response = StreamingHttpResponse(_chunks(lines()), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


#: A download goes out in pieces of about this many characters: one piece a line cost a trip
#: through the server's event loop for each (4.8 s for 51,583 lines, 8.6 MB).
CHUNK_CHARS = 256 * 1024


def _chunks(pieces: Iterator[str]) -> Iterator[str]:
    """``pieces`` joined into strings of about ``CHUNK_CHARS``, in order."""
    held: list[str] = []
    size = 0
    for piece in pieces:
        held.append(piece)
        size += len(piece)
        if size >= CHUNK_CHARS:
            yield "".join(held)
            held, size = [], 0
    if held:
        yield "".join(held)


async def launch_events(request: HttpRequest, pk: int) -> HttpResponseBase:
    """The live log as Server-Sent Events: ``lines`` events (id = last seq, data = [[seq, text,
    level, rank, node], …]; rows published by an older follower may lack ``node``), ``state``
    when the status or phase changed, ``end`` when nothing more comes. GET only: a HEAD would
    hold a stream open that no client reads. 400 for a ``Last-Event-ID`` or ``?after=`` that is
    not a sequence number (the header, which a reconnecting browser sends, wins over
    ``after``)."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"], "This stream is read with GET.")
    user = await request.auser()
    # Whoever may open the launch's page and read its lines may follow them (no role asked, as
    # for the page and /lines/; the team's visibility decides).
    if not user.is_authenticated:
        return HttpResponse("Log in to follow this launch.", status=403)
    seen = await sync_to_async(visible_launches)(user)
    if not await seen.filter(pk=pk).aexists():
        return HttpResponse("No such launch.", status=404)
    try:
        header = _seq(request.headers.get("Last-Event-ID"), "Last-Event-ID")
        after = header if header is not None else _seq(request.GET.get("after"), "after") or 0
    except BadNumber as exc:
        return HttpResponse(str(exc), status=400)
    limit = settings.RANKWISE_STREAMS_PER_USER
    if _open_streams[user.pk] >= limit:
        # A burst of reconnects or a script must not hold the panel's connections: each
        # stream holds a Redis connection and a database poll until its client goes.
        return HttpResponse(
            f"You have {limit} live logs open already: close some tabs (a page follows one).",
            status=429,
            headers={"Retry-After": "5"},
        )
    events = _counted(user.pk, _events(pk, after, seen))
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


#: Live streams open now, by user id, in this panel process (asyncio: one thread touches it).
_open_streams: collections.Counter[int] = collections.Counter()


async def _counted(user_id: int, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """``events``, counted in ``_open_streams`` while they run: the stream ends (and is
    uncounted) when its client goes, Django cancelling it on the disconnect."""
    _open_streams[user_id] += 1
    try:
        async for event in events:
            yield event
    finally:
        _open_streams[user_id] -= 1
        if _open_streams[user_id] <= 0:
            del _open_streams[user_id]
        await cast(Any, events).aclose()


def _event(rows: list[Any]) -> str:
    return f"id: {rows[-1][0]}\nevent: lines\ndata: {json.dumps(rows)}\n\n"


async def _events(pk: int, after: int, seen: QuerySet[Launch]) -> AsyncIterator[str]:
    """The stream's events; ``seen``: the launches its viewer may see, re-read every
    ``RECHECK_S`` (the stream ends, without ``end``, once the launch is not among them)."""
    client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1)
    pubsub: Any = None
    last, shown, quiet = after, None, 0.0
    loop = asyncio.get_running_loop()
    checked = loop.time()
    try:
        yield "retry: 1000\n\n"
        while True:
            if loop.time() - checked >= RECHECK_S:
                if not await seen.filter(pk=pk).aexists():
                    return
                checked = loop.time()
            if pubsub is None:
                pubsub = await _subscribe(client, pk)
            rows: list[Any] = [
                list(row)
                async for row in LaunchLogLine.objects.filter(launch_id=pk, seq__gt=last)
                .order_by("seq")
                .values_list(*log_view.FIELDS)[:BATCH]
            ]
            if rows:
                last = int(rows[-1][0])
                quiet = 0.0
                yield _event(rows)
                if len(rows) == BATCH:
                    continue
            state = (
                await Launch.objects.filter(pk=pk)
                .values("status", "progress", "last_seq", "log_complete", "started", "health_at")
                .afirst()
            )
            if state is None:
                return
            now = (state["status"], json.dumps(state["progress"]), state["health_at"])
            if now != shown:
                shown = now
                yield f"event: state\ndata: {json.dumps({'status': state['status']})}\n\n"
            ended = state["status"] in LAUNCH_ENDED
            if (
                ended
                and last >= state["last_seq"]
                and (state["log_complete"] or not state["started"])
            ):
                yield "event: end\ndata: {}\n\n"
                return
            # Relay published lines straight on while they follow the last one sent; anything
            # else (word without lines, a gap, a second without word) goes round the database.
            waited = loop.time()
            while True:
                pubsub, message = await _wait(pubsub)
                published = _published(message, last)
                if published is None:
                    break
                # What else has arrived meanwhile goes in the same event: one event a batch
                # while the stream is quiet, fewer and bigger ones when it is busy.
                gap = False
                while pubsub is not None and len(published) < BATCH:
                    pubsub, message = await _wait(pubsub, 0)
                    if message is None:
                        break
                    more = _published(message, int(published[-1][0]) if published else last)
                    if more is None:
                        gap = True
                        break
                    published += more
                if published:
                    last = int(published[-1][0])
                    quiet = 0.0
                    yield _event(published)
                if gap or loop.time() - waited >= 1.0:
                    break
            quiet += 1.0
            if quiet >= 15:
                quiet = 0.0
                yield ": keep-alive\n\n"
    finally:
        if pubsub is not None:
            with contextlib.suppress(RedisError):
                await pubsub.aclose()
        await client.aclose()


def _published(message: Any, last: int) -> list[Any] | None:
    """The published lines after ``last`` when they follow it with no gap (``[]`` when all were
    sent already), else ``None``: the caller reads the database."""
    if not isinstance(message, dict) or not isinstance(message.get("data"), bytes | str):
        return None
    try:
        word = json.loads(message["data"])
    except ValueError:
        return None
    rows = word.get("rows") if isinstance(word, dict) else None
    if not isinstance(rows, list) or not rows:
        return None
    fresh = [
        row
        for row in rows
        if isinstance(row, list) and row and isinstance(row[0], int) and row[0] > last
    ]
    if fresh and fresh[0][0] != last + 1:
        return None
    return fresh


async def _subscribe(client: aioredis.Redis, pk: int) -> Any:
    try:
        pubsub = client.pubsub()
        await pubsub.subscribe(channel(pk))
        return pubsub
    except (RedisError, OSError):
        return None


async def _wait(pubsub: Any, timeout: float = 1.0) -> tuple[Any, Any]:
    """The next word from the follower, waiting at most ``timeout`` s; without Redis, half a
    second and no word. Returns the subscription (``None`` when Redis went away) and the
    message."""
    if pubsub is None:
        await asyncio.sleep(0.5)
        return None, None
    try:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout)
        return pubsub, message
    except (RedisError, OSError):
        return None, None
