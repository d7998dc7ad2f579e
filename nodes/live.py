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
import threading
from collections.abc import Sequence
from typing import Any

import redis
from django.conf import settings

# One connection per process that asks for no replies (``CLIENT REPLY OFF``): the follower sends
# a batch and reads on at once instead of waiting a round trip to Redis, which on a busy node
# host cost milliseconds a batch. The lock keeps the follower's and its writer's words whole.
_lock = threading.Lock()
# redis-py's connection class has no annotations; ``Any`` says so.
_connection: Any = None


def channel(launch_id: int) -> str:
    """The launch's channel name."""
    return f"rankwise:launch:{launch_id}"


#: Text a message carries at most; past it readers read the batch from the database.
ROWS_MAX_CHARS = 512 * 1024


def publish(launch_id: int, seq: int, rows: Sequence[Sequence[Any]] = ()) -> bool:
    """Tell live viewers of lines up to ``seq`` (with ``rows`` themselves when given and small
    enough); True when the word was sent with the rows. Never raises for Redis: a word that
    could not be sent is only late (viewers read the database when they see a gap)."""
    global _connection
    word: dict[str, Any] = {"seq": seq}
    carried = bool(rows) and sum(len(row[1]) for row in rows) <= ROWS_MAX_CHARS
    if carried:
        word["rows"] = [list(row) for row in rows]
    with _lock:
        try:
            if _connection is None:
                _connection = _quiet_connection()
            _connection.send_command("PUBLISH", channel(launch_id), json.dumps(word))
        except (redis.RedisError, OSError):
            if _connection is not None:
                _connection.disconnect()
            _connection = None
            return False
    return carried


def _quiet_connection() -> Any:
    """A connection to ``REDIS_URL`` on which Redis sends no replies."""
    pool = redis.ConnectionPool.from_url(
        settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1
    )
    connection: Any = pool.make_connection()
    connection.connect()
    connection.send_command("CLIENT", "REPLY", "OFF")
    return connection
