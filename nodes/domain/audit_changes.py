"""What an audit entry changed, in words: the fields whose value differs between ``before`` and
``after`` (a created object's fields all count, a deleted one's too), each value in one short
line rather than raw JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: A value longer than this is cut, with an ellipsis; the page links to the object itself.
MAX_VALUE_CHARS = 240


@dataclass(frozen=True)
class Change:
    """One field: ``before`` and ``after`` in words (``None``: it was not there)."""

    field: str
    before: str | None
    after: str | None


def changes(before: Any, after: Any) -> list[Change]:
    """The changed fields of two JSON snapshots (objects), in their keys' order, after's keys
    first. A snapshot that is not an object is one field named ``value``."""
    old = before if isinstance(before, Mapping) else ({} if before is None else {"value": before})
    new = after if isinstance(after, Mapping) else ({} if after is None else {"value": after})
    keys = list(dict.fromkeys([*new, *old]))
    return [
        Change(str(k), _text(old[k]) if k in old else None, _text(new[k]) if k in new else None)
        for k in keys
        if old.get(k, _MISSING) != new.get(k, _MISSING)
    ]


_MISSING = object()


def _text(value: Any) -> str:
    """A JSON value in one line: ``none`` for null, strings as they are, lists joined by
    commas, objects as ``key=value``, the rest as JSON."""
    if value is None:
        said = "none"
    elif isinstance(value, str):
        said = value
    elif isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        said = ", ".join(str(v) for v in value) or "none"
    elif isinstance(value, list) and all(_flat(v) for v in value):
        # A list of records (pre-flight checks): one "k=v, …" per record.
        said = "; ".join(", ".join(f"{k}={v}" for k, v in item.items()) for item in value)
    elif _flat(value):
        said = ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
    else:
        said = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return said if len(said) <= MAX_VALUE_CHARS else said[: MAX_VALUE_CHARS - 1] + "…"


def _flat(value: Any) -> bool:
    """A record whose values are all plain (no list, no object)."""
    return isinstance(value, Mapping) and all(
        not isinstance(v, dict | list) for v in value.values()
    )
