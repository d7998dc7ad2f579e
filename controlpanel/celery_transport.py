"""Celery's Redis transport, made to survive a Redis restart.

When the broker connection breaks, kombu 5.7's Redis QoS tries to put the worker's unacknowledged
messages (tasks running, tasks held for their ETA) back on their queues while closing the broken
connection; with Redis down that fails with an AttributeError (celery/kombu#582, #970) and the
worker exits with "Unrecoverable error" instead of reconnecting. Nothing is lost by not restoring
them then: they stay in Redis's unacked set, and kombu restores them itself once Redis answers
again (``restore_visible``, after the visibility timeout). So a failed restore at close is logged
and the worker goes on to reconnect. Launches never depend on a message surviving anyway: the
reconciler re-adopts them from the database.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)


class QoS(kombu_redis.QoS):
    def restore_unacked(self, client: Any = None) -> None:
        try:
            super().restore_unacked(client)
        except (AttributeError, OSError, RedisError) as exc:
            log.warning("Redis is away; unacknowledged messages stay queued for later: %s", exc)


class Channel(kombu_redis.Channel):
    QoS = QoS


class Transport(kombu_redis.Transport):
    Channel = Channel
