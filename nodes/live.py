"""The live channel: a launch's new log lines, from its follower to the browsers watching it
(Server-Sent Events), and word that its state moved. The database is the record; the channel
only makes it quick.

Redis pub/sub, one channel per launch. A message is JSON: ``{"seq": N}`` (lines up to N are
stored, or the state moved) or ``{"seq": N, "rows": [[seq, text, level, rank], …]}``, the lines
of a batch published before it is committed (up to ``ROWS_MAX_CHARS`` of text; a bigger batch
goes as word alone). A Redis that is away only makes readers fall back to reading the database
on a timer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis
from django.conf import settings

_redis: redis.Redis | None = None


def channel(launch_id: int) -> str:
    """The launch's channel name."""
    return f"rankwise:launch:{launch_id}"


#: Text a message carries at most; past it readers read the batch from the database.
ROWS_MAX_CHARS = 512 * 1024


def publish(launch_id: int, seq: int, rows: Sequence[Sequence[Any]] = ()) -> None:
    """Tell live viewers of lines up to ``seq`` (with ``rows`` themselves when given and small
    enough); never raises for Redis."""
    global _redis
    word: dict[str, Any] = {"seq": seq}
    if rows and sum(len(row[1]) for row in rows) <= ROWS_MAX_CHARS:
        word["rows"] = [list(row) for row in rows]
    try:
        if _redis is None:
            _redis = redis.Redis.from_url(
                settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1
            )
        _redis.publish(channel(launch_id), json.dumps(word))
    except redis.RedisError:
        _redis = None
