"""A small Server-Sent Events reader for the live log endpoint (tests and benchmarks)."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Event:
    name: str
    id: str
    data: str

    def lines(self) -> list[tuple[int, str]]:
        return [(int(seq), text) for seq, text, *_ in json.loads(self.data)]


def events(url: str, cookie: str, last_id: str = "", timeout: float = 30) -> Iterator[Event]:
    """Events from ``url`` until the server ends the stream; raises OSError when it breaks."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    headers = {"Cookie": cookie, "Accept": "text/event-stream"}
    if last_id:
        headers["Last-Event-ID"] = last_id
    connection.request(
        "GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers
    )
    response = connection.getresponse()
    if response.status != 200:
        raise OSError(f"{url}: HTTP {response.status}")
    name, ident, data = "message", "", list[str]()
    try:
        while True:
            raw = response.readline()
            if not raw:
                return
            line = raw.decode().rstrip("\n")
            if not line:
                if data:
                    yield Event(name, ident, "\n".join(data))
                name, data = "message", []
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "id":
                ident = value
            elif field == "data":
                data.append(value)
    finally:
        connection.close()


def follow(url: str, cookie: str, deadline: float) -> list[tuple[int, str, int]]:
    """Every line the stream delivers until its ``end`` event, reconnecting (with Last-Event-ID)
    when the connection drops, as a browser does. Returns (seq, text, receive time ns)."""
    got: list[tuple[int, str, int]] = []
    last = ""
    while time.monotonic() < deadline:
        try:
            for event in events(url, cookie, last):
                if event.name == "lines":
                    now = time.time_ns()
                    got += [(seq, text, now) for seq, text in event.lines()]
                    last = event.id
                elif event.name == "end":
                    return got
        except OSError:
            time.sleep(0.5)
    return got


async def read_stream(response) -> str:
    parts = []
    async for chunk in response.streaming_content:
        parts.append(chunk.decode() if isinstance(chunk, bytes) else chunk)
    return "".join(parts)


def in_fresh_loop(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine on an event loop of its own thread: the browser tests leave Playwright's
    loop on this one, and Django refuses to nest."""
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(value=asyncio.run(coroutine)))
    thread.start()
    thread.join(30)
    return box["value"]
