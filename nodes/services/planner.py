"""The profile form's planner: the settings that reach a workload on the form's node, each
checked by the budget as saving would check it (``domain.planner``)."""

from __future__ import annotations

import math

from nodes.domain import planner
from nodes.domain.budget_device import default_mem_fraction, parallel_of
from nodes.domain.budget_types import NodeMemory
from nodes.domain.sglang_flags import ParsedCommand, parse_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import Node
from nodes.services.model_facts import ModelFacts
from nodes.services.profiles import checker


def plan_for(
    node: Node,
    args: list[str],
    env: dict[str, str],
    model: ModelFacts,
    memory: NodeMemory,
    workload: planner.Workload,
) -> list[planner.Plan]:
    """``domain.planner.plan`` for the revision ``args`` on ``node`` (its memory as
    ``memory``, the model as ``model``)."""
    flags_table = table(node.sglang_version or DEFAULT_VERSION)
    flags = parse_command(args, flags_table)
    parallel = parallel_of(flags)
    if not flags.values:
        return []  # flags SGLang refuses: nothing to plan from
    check = checker(args, node, model, env=env, memory=memory)
    changes = planner.changes_to_try(
        mfs=mem_fraction_of(flags, memory),
        kv_dtype=parallel.dtype,
        tp=parallel.tp,
        gpus=len(memory.gpu_memory_bytes) or parallel.tp,
        hicache=bool(flags.get("enable_hierarchical_cache", default=False)),
    )
    return planner.plan(workload, changes, check)


def mem_fraction_of(flags: ParsedCommand, memory: NodeMemory) -> float | None:
    """``--mem-fraction-static`` as given, else SGLang's default for the node's cards as the
    budget takes it (``domain.budget_device.default_mem_fraction``); ``None`` when neither is
    known or the value is not a number."""
    given = flags.get("mem_fraction_static")
    if given is not None:
        return float(given) if math.isfinite(float(given)) else None
    gpu_bytes = max(memory.gpu_memory_bytes, default=0)
    parallel = parallel_of(flags)
    return default_mem_fraction(gpu_bytes, parallel.tp, parallel.pp) if gpu_bytes else None
