"""The log viewer's reads of a launch's stored lines: a window of them by sequence number (after,
before or around one), filtered by level, rank, node or the diagnosis's evidence, and a search over
all of them. Every read is bounded and uses the ``(launch, seq)`` index (or the partial index of
warnings and errors), so a launch with a million stored lines answers as fast as a short one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet

from nodes.domain.log_lines import LEVELS
from nodes.models import Launch, LaunchLogLine

#: Lines one window read returns at most.
WINDOW_MAX = 1000
#: Matches one search returns (the count goes on to ``COUNT_MAX``).
MATCHES_MAX = 200
COUNT_MAX = 100_000
RANK_SAMPLE = 5000

#: One line as the viewer gets it: ``[seq, text, level, rank, node]`` (``node``: the inventory
#: name of the node that printed it in a multi-node launch, ``""`` on one node).
Row = tuple[int, str, int, str, str]
FIELDS = ("seq", "text", "level", "rank", "node")
#: A node's name is at most this long (``LaunchLogLine.node``).
NODE_MAX = 64


class BadFilter(ValueError):
    """A filter the viewer does not offer (the message says which values it takes)."""


@dataclass(frozen=True)
class Filters:
    """``level``: ``"warning"`` (warnings and errors) or ``"error"``; ``rank``: as the line's
    prefix names it (``"TP3"``); ``node``: the name of the node that printed the line (a
    multi-node launch's); ``evidence``: only the diagnosis's evidence lines."""

    level: str = ""
    rank: str = ""
    evidence: bool = False
    node: str = ""

    @classmethod
    def of(cls, params: Any) -> Filters:
        """From a request's query parameters; raises ``BadFilter``."""
        level = str(params.get("level") or "")
        if level and level not in LEVELS or level == "info":
            raise BadFilter("level is warning or error")
        rank = str(params.get("rank") or "")
        if len(rank) > 32 or "\x00" in rank:
            raise BadFilter("rank is a prefix such as TP3")
        evidence = str(params.get("evidence") or "")
        if evidence not in ("", "0", "1", "true", "false", "on", "off"):
            raise BadFilter("evidence is 1 or 0")
        node = str(params.get("node") or "")
        if len(node) > NODE_MAX or "\x00" in node:
            raise BadFilter(f"node is a node's name (at most {NODE_MAX} characters)")
        return cls(level, rank, evidence in ("1", "true", "on"), node)

    def apply(self, launch: Launch, lines: QuerySet[LaunchLogLine]) -> QuerySet[LaunchLogLine]:
        if self.level:
            lines = lines.filter(level__gte=LEVELS[self.level])
        if self.rank:
            lines = lines.filter(rank=self.rank)
        if self.node:
            lines = lines.filter(node=self.node)
        if self.evidence:
            lines = lines.filter(seq__in=evidence_lines(launch))
        return lines


@dataclass(frozen=True)
class Window:
    """Lines in ascending order, and whether stored lines (matching the filters) lie before the
    first or after the last."""

    rows: list[Row]
    more_before: bool
    more_after: bool


def evidence_lines(launch: Launch) -> set[int]:
    """Sequence numbers the launch's diagnosis cites as evidence."""
    diagnosis = launch.diagnosis if isinstance(launch.diagnosis, dict) else {}
    items = diagnosis.get("evidence")
    return {
        line
        for item in (items if isinstance(items, list) else [])
        for line in [item.get("line") if isinstance(item, dict) else None]
        if isinstance(line, int) and not isinstance(line, bool) and 0 < line < 2**31
    }


def window(
    launch: Launch,
    *,
    after: int | None = None,
    before: int | None = None,
    around: int | None = None,
    limit: int = WINDOW_MAX,
    filters: Filters = Filters(),  # noqa: B008 - frozen, so one shared default is safe
) -> Window:
    """Up to ``limit`` lines after ``after``, before ``before``, centred on ``around``, or the
    last ones when none is given."""
    limit = max(1, min(limit, WINDOW_MAX))
    lines = filters.apply(launch, launch.lines.all())
    if around is not None:
        head = _rows(lines.filter(seq__lt=around).order_by("-seq")[: limit // 2 + 1])[::-1]
        tail = _rows(lines.filter(seq__gte=around).order_by("seq")[: limit - limit // 2 + 1])
        more_before = len(head) > limit // 2
        more_after = len(tail) > limit - limit // 2
        return Window(
            head[int(more_before) :] + tail[: limit - limit // 2], more_before, more_after
        )
    if after is not None:
        rows = _rows(lines.filter(seq__gt=after).order_by("seq")[: limit + 1])
        more = len(rows) > limit
        earlier = after > 0 and lines.filter(seq__lte=after).exists()
        return Window(rows[:limit], more_before=earlier, more_after=more)
    if before is not None:
        lines = lines.filter(seq__lt=before)
    rows = _rows(lines.order_by("-seq")[: limit + 1])[::-1]
    more = len(rows) > limit
    later = before is not None and lines_after(launch, filters, before)
    return Window(rows[int(more) :], more_before=more, more_after=later)


def lines_after(launch: Launch, filters: Filters, seq: int) -> bool:
    """Whether stored lines matching ``filters`` lie at or past ``seq``."""
    return filters.apply(launch, launch.lines.filter(seq__gte=seq)).exists()


def _rows(lines: QuerySet[LaunchLogLine]) -> list[Row]:
    return [(s, t, lv, r, n) for s, t, lv, r, n in lines.values_list(*FIELDS)]


def _containing(text: str) -> Q:
    """Lines containing ``text``, any case. SQLite's LIKE folds ASCII letters only (``äö``
    would not find ``ÄÖ``), so there text beyond ASCII is matched by Python's ``re`` (Django's
    REGEXP for SQLite), which folds every letter; PostgreSQL's UPPER does already."""
    if text.isascii() or connection.vendor != "sqlite":
        return Q(text__icontains=text)
    return Q(text__iregex=re.escape(text))


def search(launch: Launch, text: str, filters: Filters = Filters()) -> tuple[int, list[Row]]:  # noqa: B008
    """Stored lines containing ``text`` (case-insensitive, every alphabet), the first
    ``MATCHES_MAX`` in order, and how many there are (counted up to ``COUNT_MAX``)."""
    lines = filters.apply(launch, launch.lines.filter(_containing(text))).order_by("seq")
    rows = _rows(lines[:MATCHES_MAX])
    if len(rows) < MATCHES_MAX:
        return len(rows), rows
    return lines[:COUNT_MAX].count(), rows


def matches_after(
    launch: Launch,
    text: str,
    after: int,
    filters: Filters = Filters(),  # noqa: B008
) -> tuple[list[Row], bool]:
    """The next ``MATCHES_MAX`` stored lines after line ``after`` containing ``text`` (as
    ``search`` finds them), and whether more follow."""
    lines = filters.apply(launch, launch.lines.filter(_containing(text), seq__gt=after))
    rows = _rows(lines.order_by("seq")[: MATCHES_MAX + 1])
    return rows[:MATCHES_MAX], len(rows) > MATCHES_MAX


def ranks(launch: Launch) -> list[str]:
    """The ranks that wrote lines, as the prefixes name them, in order (``TP2`` before
    ``TP10``). Read from the first and the last ``RANK_SAMPLE`` lines: every rank prints at
    start-up, and a million-line log is not scanned for it."""
    lines = launch.lines.exclude(rank="").values_list("rank", flat=True)
    found = set(lines.order_by("seq")[:RANK_SAMPLE]) | set(lines.order_by("-seq")[:RANK_SAMPLE])
    return sorted(found, key=lambda r: [(len(p), p) for p in r.split()])


def nodes(launch: Launch) -> list[str]:
    """The names of a multi-node launch's nodes in node-rank order (node 0's first), as its
    lines name them; ``[]`` for a launch on one node."""
    parts = list(launch.parts.order_by("node_rank").values_list("node__name", flat=True))
    return [launch.node.name, *parts] if parts else []
