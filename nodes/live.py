"""The live channel: word that a launch has new log lines stored, from its follower to the
browsers watching it (Server-Sent Events). The database is the record; this only wakes readers.

Redis pub/sub, one channel per launch, the message the last stored sequence number. A Redis that
is away only makes readers fall back to reading the database on a timer.
"""

from __future__ import annotations

import redis
from django.conf import settings

_redis: redis.Redis | None = None


def channel(launch_id: int) -> str:
    """The launch's channel name."""
    return f"rankwise:launch:{launch_id}"


def publish(launch_id: int, seq: int) -> None:
    """Tell live viewers that lines up to ``seq`` are stored; never raises for Redis."""
    global _redis
    try:
        if _redis is None:
            _redis = redis.Redis.from_url(
                settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1
            )
        _redis.publish(channel(launch_id), str(seq))
    except redis.RedisError:
        _redis = None
