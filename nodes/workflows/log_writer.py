"""Store a follower's log lines off its read loop.

The follower publishes each batch of lines to live viewers the moment it has read them
(``nodes.live``) and hands the batch here; a thread of its own commits what has queued up, at
most every ``COMMIT_EVERY_S`` (one batch at once on a quiet stream, many in one transaction on a
busy one), so a commit never holds up the next read and a busy stream costs few commits. Each
commit moves the launch's stored byte offset with a conditional update (the lease's token and
the offset it expects), so two writers can never both store the same bytes, and a follower that
starts again reads on from exactly what is stored.

The queue is bounded: when the database falls behind, ``put`` waits, the follower stops
reading, and the node's ``tail`` waits on the SSH window; nothing is dropped.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from nodes.live import publish
from nodes.models import Launch, LaunchLogLine

#: The first lines of a launch are kept whatever the retention (the start-up story is there).
HEAD_LINES_KEPT = 1000
#: Batches waiting at most; past it the follower waits (a batch is one read, ≤ 1 MiB).
QUEUE_BATCHES = 256
#: Rows one transaction stores at most.
COMMIT_ROWS_MAX = 20_000
#: The least time between two commits while lines keep coming (s); a flush does not wait.
COMMIT_EVERY_S = 0.05
# Words to the thread besides batches: commit now; commit and stop.
_FLUSH, _STOP = "flush", "stop"


class LeaseLost(Exception):
    """Another follower took the launch over; this one stops without writing."""


@dataclass(frozen=True)
class Batch:
    """Lines read in one go: ``rows`` as ``(seq, text, level, rank)``, masked; ``size`` the
    bytes of the node's file they end (a partial last line is not in them); ``progress`` the
    start-up progress to store with them (``None``: unchanged); ``announced`` False when the
    viewers were told of them without the rows (they read them from the database once stored)."""

    rows: list[tuple[int, str, int, str]]
    size: int
    progress: dict[str, Any] | None = None
    announced: bool = True


class LogWriter:
    """Commits ``Batch``es for launch ``launch_id`` under lease ``token``, from stored byte
    ``offset``. ``threaded=False`` commits in ``put`` itself (one caller, one connection).

    ``group_id``: the lines are one node's of a multi-node launch, stored in the group's one log
    (``group_id``'s lines, tagged ``node``) beside the other nodes' followers'. Their numbers are
    then taken from the group's ``last_seq`` in the commit itself (the row's lock orders the
    writers), so they are published after it, with those numbers; ``seq`` in the batch's rows is
    ignored."""

    def __init__(
        self,
        launch_id: int,
        token: str,
        offset: int,
        *,
        threaded: bool = True,
        group_id: int | None = None,
        node: str = "",
    ) -> None:
        self.launch_id = launch_id
        self.token = token
        self.offset = offset
        self.group_id = group_id
        self.node = node
        self._error: BaseException | None = None
        #: When a commit last renewed the lease (monotonic s; -inf: never).
        self.renewed = float("-inf")
        self._queue: queue.Queue[Batch | str] = queue.Queue(QUEUE_BATCHES)
        self._committed = float("-inf")
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(
                target=self._run, name=f"log-writer-{launch_id}", daemon=True
            )
            self._thread.start()

    def put(self, batch: Batch) -> None:
        """Queue ``batch`` (waits while the queue is full). Raises ``LeaseLost`` or the
        database's error once a commit failed: nothing after it is stored."""
        self._raise()
        if self._thread is None:
            self._commit([batch])
        else:
            self._queue.put(batch)

    def flush(self) -> None:
        """Wait until every batch put is committed; raises as ``put`` does."""
        if self._thread is not None:
            self._queue.put(_FLUSH)
            self._queue.join()
        self._raise()

    def close(self) -> None:
        """Commit what is queued and stop the thread; raises as ``put`` does."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            while True:
                item = self._queue.get()
                batches: list[Batch] = []
                rows = words = 0
                due = self._committed + COMMIT_EVERY_S
                while True:
                    if isinstance(item, str):  # a flush or the stop: commit now
                        words += 1
                        break
                    batches.append(item)
                    rows += len(item.rows)
                    left = due - time.monotonic()
                    if rows >= COMMIT_ROWS_MAX:
                        break
                    try:
                        item = (
                            self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
                        )
                    except queue.Empty:
                        break
                try:
                    if batches and self._error is None:
                        self._commit(batches)
                        self._committed = time.monotonic()
                except BaseException as exc:  # kept for the follower, which raises it
                    self._error = exc
                finally:
                    for _ in range(len(batches) + words):
                        self._queue.task_done()
                if item == _STOP:
                    return
        finally:
            connection.close()  # this thread's own connection

    def _commit(self, batches: list[Batch]) -> None:
        if self.group_id is not None:
            self._commit_to_group(batches, self.group_id)
            return
        rows = [row for batch in batches for row in batch.rows]
        size = sum(batch.size for batch in batches)
        progress = next((b.progress for b in reversed(batches) if b.progress is not None), None)
        fields: dict[str, Any] = {"log_offset": self.offset + size, "worker_beat": timezone.now()}
        if rows:
            fields["last_seq"] = rows[-1][0]
        if progress is not None:
            fields["progress"] = progress
        with transaction.atomic():
            if not Launch.objects.filter(
                pk=self.launch_id, worker_token=self.token, log_offset=self.offset
            ).update(**fields):
                raise LeaseLost
            if rows:
                # Django's own cursor, without a model instance per line: at thousands of lines
                # a second the ORM's per-object work would hold the GIL the reader needs.
                stamp = _TIME.get_db_prep_value(timezone.now(), connection)
                with connection.cursor() as cursor:
                    cursor.executemany(
                        _insert_sql(),
                        [(self.launch_id, s, t, stamp, lv, r, "") for s, t, lv, r in rows],
                    )
            if rows:
                dropped = self._trim(rows[-1][0])
                if dropped:
                    Launch.objects.filter(pk=self.launch_id).update(
                        lines_dropped=F("lines_dropped") + dropped
                    )
        self.offset += size
        self.renewed = time.monotonic()
        # Viewers told of lines without the rows read them once stored: word that they are.
        if rows and not all(batch.announced for batch in batches):
            publish(self.launch_id, rows[-1][0])

    def _commit_to_group(self, batches: list[Batch], group_id: int) -> None:
        """One node's lines into the group's log: this launch's offset moved under its lease,
        the lines numbered on from the group's last one, then published with those numbers."""
        texts = [row[1:] for batch in batches for row in batch.rows]
        size = sum(batch.size for batch in batches)
        progress = next((b.progress for b in reversed(batches) if b.progress is not None), None)
        fields: dict[str, Any] = {"log_offset": self.offset + size, "worker_beat": timezone.now()}
        if progress is not None:
            fields["progress"] = progress
        rows: list[tuple[int, str, int, str, str]] = []
        with transaction.atomic():
            if not Launch.objects.filter(
                pk=self.launch_id, worker_token=self.token, log_offset=self.offset
            ).update(**fields):
                raise LeaseLost
            if texts:
                # The UPDATE locks the group's row until the commit: the next writer numbers on
                # from these lines, and finds them stored.
                Launch.objects.filter(pk=group_id).update(last_seq=F("last_seq") + len(texts))
                last = Launch.objects.values_list("last_seq", flat=True).get(pk=group_id)
                first = last - len(texts) + 1
                rows = [(first + i, t, lv, r, self.node) for i, (t, lv, r) in enumerate(texts)]
                stamp = _TIME.get_db_prep_value(timezone.now(), connection)
                with connection.cursor() as cursor:
                    cursor.executemany(
                        _insert_sql(),
                        [(group_id, s, t, stamp, lv, r, n) for s, t, lv, r, n in rows],
                    )
                dropped = self._trim(last, group_id)
                if dropped:
                    Launch.objects.filter(pk=group_id).update(
                        lines_dropped=F("lines_dropped") + dropped
                    )
        self.offset += size
        self.renewed = time.monotonic()
        if rows:
            publish(group_id, rows[-1][0], rows)

    def _trim(self, last: int, launch_id: int | None = None) -> int:
        """Drop the oldest lines past ``RANKWISE_LOG_LINES_MAX`` (the head kept); how many."""
        keep = settings.RANKWISE_LOG_LINES_MAX
        if last <= keep:
            return 0
        deleted, _ = LaunchLogLine.objects.filter(
            launch_id=launch_id or self.launch_id,
            seq__gt=HEAD_LINES_KEPT,
            seq__lte=last - (keep - HEAD_LINES_KEPT),
        ).delete()
        return deleted


_TIME = LaunchLogLine._meta.get_field("time")
_COLUMNS = ("launch", "seq", "text", "time", "level", "rank", "node")


def _insert_sql(names: tuple[str, ...] = _COLUMNS) -> str:
    """``INSERT`` of one log line, columns in ``names``' order, as this database quotes."""
    meta, quote = LaunchLogLine._meta, connection.ops.quote_name
    column = {field.name: field.column for field in meta.concrete_fields}
    columns = ", ".join(quote(column[name]) for name in names)
    marks = ", ".join(["%s"] * len(names))
    return f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ({marks})"
