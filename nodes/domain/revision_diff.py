"""What changed between two profile revisions: flags added, removed or changed (read as the
version's parser reads them, so ``--tp 8`` and ``--tp-size=8`` are the same flag), and
environment variables."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodes.domain.redact import MASK, is_secret_flag, mask_assignments, redact_env
from nodes.domain.sglang_flags import FlagTable, parse_command


@dataclass(frozen=True)
class Change:
    """``kind`` is ``added``, ``removed`` or ``changed``; values as the parser reads them
    (secrets masked)."""

    name: str
    kind: str
    before: Any
    after: Any


def diff(
    a: Sequence[str],
    b: Sequence[str],
    table: FlagTable,
    env_a: Mapping[str, str] | None = None,
    env_b: Mapping[str, str] | None = None,
) -> list[Change]:
    """Flags then environment variables that differ from ``a`` to ``b``, in option order."""
    first, second = parse_command(list(a), table), parse_command(list(b), table)
    names = {spec.dest: _name(spec.options) for spec in table.flags}
    changes = []
    for dest in sorted(first.given | second.given, key=lambda d: names.get(d, d)):
        before = first.values.get(dest) if dest in first.given else None
        after = second.values.get(dest) if dest in second.given else None
        if dest in first.given and dest in second.given and before == after:
            continue
        kind = (
            "added"
            if dest not in first.given
            else "removed"
            if dest not in second.given
            else "changed"
        )
        name = names.get(dest, dest)
        if is_secret_flag(name, table):
            before, after = (MASK if v is not None else None for v in (before, after))
        else:
            before, after = _shown(before), _shown(after)
        changes.append(Change(name, kind, before, after))
    shown_a, shown_b = redact_env(dict(env_a or {})), redact_env(dict(env_b or {}))
    for var in sorted(set(shown_a) | set(shown_b)):
        if (env_a or {}).get(var) == (env_b or {}).get(var):
            continue
        kind = "added" if var not in shown_a else "removed" if var not in shown_b else "changed"
        changes.append(Change(f"env {var}", kind, shown_a.get(var), shown_b.get(var)))
    return changes


def _name(options: Sequence[str]) -> str:
    """The longest ``--`` spelling: SGLang's canonical name (``--tp-size`` over ``--tp``)."""
    long = [o for o in options if o.startswith("--")]
    return max(long, key=len) if long else options[0]


def _shown(value: Any) -> Any:
    """A flag's parsed value with the secrets it spells out masked (a URL's password, a JSON
    value's ``"secret_key"``); a parsed JSON value stays JSON where the mask allows."""
    if isinstance(value, str):
        return mask_assignments(value)
    if not isinstance(value, dict | list):
        return value
    text = json.dumps(value)
    masked = mask_assignments(text)
    if masked == text:
        return value
    try:
        return json.loads(masked)
    except ValueError:
        return masked
