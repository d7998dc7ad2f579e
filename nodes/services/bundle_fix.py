"""The flags a bundle's diagnosis suggests (``manage.py diagnose --json``'s ``change``),
computed with the budget arithmetic on the bundle's own node and command.

A bundle has no launch or revision: its node is ``facts.json``'s ``node`` (MemTotal, GPU
sizes), MemAvailable the earliest snapshot's, the model its ``model_config`` and
``model_weights_bytes``. The suggestion is the diagnosis's figures (``remedy.changes_for``,
the budget's own suggestion winning for the pools it sizes); it is offered only when the budget
of the changed command on that node does not block (``manage.py budget`` exits 0 on it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodes.domain import remedy
from nodes.domain.budget import NodeMemory, check
from nodes.domain.budget_types import BudgetReport
from nodes.domain.diagnosis import Diagnosis
from nodes.domain.geometry import GeometryError, ModelGeometry, from_config
from nodes.domain.sglang_flags import VERSION_TEXT, parse_command, split_command
from nodes.flag_tables import DEFAULT_VERSION, table


def change_of(found: Diagnosis, facts: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{"--flag": value}`` (a number where the flag takes one, ``True`` for a switch it adds,
    ``None`` to drop a flag and its argument), or ``None`` when the remedy is not a flag change,
    the command cannot be read, or the changed command would still be blocked."""
    command = [str(w) for w in facts.get("command") or [] if w is not None]
    version = _version(facts)
    try:
        argv, env = split_command(command)
    except ValueError:
        return None
    engine = "vllm" if facts.get("engine") == "vllm" else "sglang"
    budget = _budget(argv, env, facts, version) if engine == "sglang" else None
    suggestion = dict(budget.suggestion) if budget and budget.suggestion else None
    changes = remedy.changes_for(found.category, found.numbers, suggestion, engine=engine)
    if not changes or engine != "sglang":
        return changes or None  # no flag table or budget for other engines: as suggested
    try:
        changed = remedy.with_changes(argv, changes, table(version))
    except ValueError:
        return None
    after = _budget(changed, env, facts, version)
    if after is not None and after.verdict == "block":
        return None
    return changes


def _version(facts: Mapping[str, Any]) -> str:
    version = facts.get("engine_version")
    return (
        version if isinstance(version, str) and VERSION_TEXT.fullmatch(version) else DEFAULT_VERSION
    )


def _budget(
    argv: list[str], env: dict[str, str], facts: Mapping[str, Any], version: str
) -> BudgetReport | None:
    """The budget of ``argv`` on the bundle's node, or ``None`` when the node's GPUs are not
    known (there is then nothing to size against)."""
    node = facts.get("node") or {}
    gpus = node.get("gpus") if isinstance(node, Mapping) else None
    sizes = [_bytes(g.get("memory_total_bytes")) for g in gpus or [] if isinstance(g, Mapping)]
    known = [s for s in sizes if s]
    if not known or len(known) != len(sizes):
        return None
    flags = parse_command(argv, table(version))
    flags.env = env
    memory = NodeMemory(
        gpu_memory_bytes=tuple(known),
        host_ram_bytes=_bytes(node.get("host_ram_bytes")),
        mem_available_bytes=_mem_available(facts),
        gpu_names=tuple(str(g.get("name") or "") for g in gpus or []),
    )
    return check(
        flags,
        memory,
        version=version,
        geometry=_geometry(facts.get("model_config")),
        weights_bytes=_bytes(facts.get("model_weights_bytes")),
    )


def _mem_available(facts: Mapping[str, Any]) -> int | None:
    """MemAvailable of the earliest snapshot that has one (before the launch took anything)."""
    for snapshot in facts.get("snapshots") or []:
        meminfo = snapshot.get("meminfo") if isinstance(snapshot, Mapping) else None
        value = _bytes((meminfo or {}).get("MemAvailable"))
        if value is not None:
            return value
    return None


def _geometry(config: Any) -> ModelGeometry | None:
    if not isinstance(config, Mapping):
        return None
    try:
        return from_config(dict(config))
    except GeometryError:
        return None


def _bytes(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
    return value if ok else None
