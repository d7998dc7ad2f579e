"""Following a page the way htmx does: a fragment that is not there yet polls its own URL
(``hx-get`` with ``hx-trigger="load delay:…"``) until a worker's reading arrives."""

from __future__ import annotations

import html
import re
import time
from typing import Any

POLLER = re.compile(r'hx-get="([^"]+)"[^>]*hx-trigger="load delay:')


def follow(client: Any, url: str, marker: str, *, timeout: float = 90, **params: Any) -> str:
    """The text of ``url`` once it holds ``marker``, following its pollers as the browser would
    (every half second); fails when ``timeout`` s pass without it."""
    deadline = time.monotonic() + timeout
    response = client.get(url, params)
    while True:
        assert response.status_code == 200, response.status_code
        text: str = response.content.decode()
        if marker in text:
            return text
        poll = POLLER.search(text)
        assert poll, f"{url}: no {marker!r} and nothing polling:\n{text[-2000:]}"
        assert time.monotonic() < deadline, f"{url}: no {marker!r} within {timeout:g} s"
        time.sleep(0.25)  # the poller's own delay
        response = client.get(html.unescape(poll.group(1)), headers={"HX-Request": "true"})


def post_until_read(client: Any, url: str, data: dict[str, Any], *, timeout: float = 90) -> str:
    """The budget panel for ``data`` once the model was read: the panel polls (re-posts the
    form) while it says the model is being read on the node, as the browser would."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.post(url, data, headers={"HX-Request": "true"})
        assert response.status_code == 200, response.status_code
        text: str = response.content.decode()
        if 'class="progress model-reading"' not in text:
            return text
        assert time.monotonic() < deadline, f"the model was not read within {timeout:g} s"
        time.sleep(0.4)  # the panel's own delay
