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
from nodes.domain.diagnosis import Diagnosis, clean_facts, engine_of
from nodes.domain.diagnosis.evidence import Bundle, Log
from nodes.domain.geometry import GeometryError, ModelGeometry, from_config
from nodes.domain.sglang_flags import VERSION_TEXT, parse_command, split_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.services.bundles import MAX_COMMAND_WORDS


def change_of(found: Diagnosis, raw_facts: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{"--flag": value}`` (a number where the flag takes one, ``True`` for a switch it adds,
    ``None`` to drop a flag and its argument), or ``None`` when the remedy is not a flag change,
    the command cannot be read, or the changed command would still be blocked. SGLang changes
    are checked by the budget when the node's GPU sizes are known; vLLM's only against the GPU
    count (no budget engine for vLLM)."""
    facts = clean_facts(raw_facts)
    command = [str(w) for w in (facts.get("command") or [])[:MAX_COMMAND_WORDS]]
    version = _version(facts)
    try:
        argv, env = split_command(command)
    except ValueError:
        return None
    env = {**(facts.get("env") or {}), **env}
    engine = engine_of(facts)
    budget = _budget(argv, env, facts, version) if engine == "sglang" else None
    suggestion = dict(budget.suggestion) if budget and budget.suggestion else None
    changes = {
        flag: value
        for flag, value in remedy.changes_for(
            found.category, found.numbers, suggestion, engine=engine
        ).items()
        if _sensible(flag, value)
    }
    if not changes:
        return None
    if engine != "sglang":
        return changes if _fits_the_gpus(changes, facts, env) else None
    for _ in range(2):
        try:
            changed = remedy.with_changes(argv, changes, table(version))
        except ValueError:
            return None
        after = _budget(changed, env, facts, version)
        if after is None or after.verdict != "block":
            return changes
        if not after.suggestion:
            return None
        # The budget's suggestion is complete for the changed command (budget.check), as on
        # the launch page (services.fixes.checked_change).
        changes = {**changes, **{k: remedy.plain(v) for k, v in after.suggestion.items()}}
    return None


#: Flags whose value is a fraction of the GPU (0 < value < 1).
FRACTIONS = {"--mem-fraction-static", "--gpu-memory-utilization"}


def _sensible(flag: str, value: Any) -> bool:
    """A value a launch can take: a switch, a drop, a positive size or count (a GPU index may
    be 0), a fraction below 1."""
    if value is None or value is True:
        return True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if flag in FRACTIONS:
        return 0 < value < 1
    return value >= 0 if flag == "--base-gpu-id" else value > 0


def _fits_the_gpus(
    changes: Mapping[str, Any], facts: Mapping[str, Any], env: Mapping[str, str]
) -> bool:
    """vLLM: a tensor-parallel size no larger than the GPUs the launch sees."""
    size = changes.get("--tensor-parallel-size")
    if not isinstance(size, int):
        return True
    count = Bundle(Log(""), {**facts, "env": env}, {}).visible_gpus()
    return count == 0 or size <= count


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
    try:
        memory = NodeMemory.from_document(facts.get("node") or {}, _mem_available(facts))
    except ValueError:
        return None
    if not memory.gpu_memory_bytes or not all(memory.gpu_memory_bytes):
        return None
    flags = parse_command(argv, table(version))
    flags.env = env
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
