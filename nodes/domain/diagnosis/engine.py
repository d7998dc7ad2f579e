"""The rules in the order they are tried, the clean-up of the facts they read, and
:func:`diagnose`; with the one rule that runs the others (:func:`leaked_after_cleanup`), which
is here so that no rule module has to import this one."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from nodes.domain.diagnosis import (
    exec_failure,
    gpu_memory,
    host_memory,
    kv_pool,
    launch_settings,
    multinode,
    nccl,
    node_setup,
    ports,
    startup,
    vllm,
)
from nodes.domain.diagnosis.evidence import Bundle, Diagnosis, Log, Rule, group_of
from nodes.domain.diagnosis.exec_failure import exec_failed
from nodes.domain.diagnosis.gpu_holders import (
    cleanup_leak,
    cleanup_survivors,
    gpu_held_at_oom,
    gpu_held_hidden,
    gpu_held_outside_at_oom,
    gpu_unbalanced,
    leak_diagnosis,
    survivors_diagnosis,
)
from nodes.domain.diagnosis.gpu_memory import (
    gpu_oom_cuda_graph,
    mem_fraction_too_low,
    mem_fraction_window,
    oom_beyond_the_weights,
    oom_loading_weights,
)
from nodes.domain.diagnosis.host_memory import (
    host_oom_cgroup,
    host_oom_hicache,
    host_oom_pinned,
    host_precheck,
)
from nodes.domain.diagnosis.kv_pool import kv_pool_exhausted
from nodes.domain.diagnosis.launch_settings import (
    block_divisibility,
    model_not_found,
    tp_divisibility,
    tp_gpu_mapping,
)
from nodes.domain.diagnosis.multinode import (
    locate,
    parted_while_serving,
    rank_died_in_init,
    store_rendezvous,
)
from nodes.domain.diagnosis.nccl import (
    gloo_loopback,
    nccl_init_hang,
    nccl_shm,
    p2p_hang,
    shm_insufficient,
    startup_collective_timeout,
)
from nodes.domain.diagnosis.node_setup import interface_missing, nccl_versions_differ
from nodes.domain.diagnosis.ports import (
    dist_store_in_use,
    port_bind_in_use,
    port_in_use,
)
from nodes.domain.diagnosis.runtime import (
    served_then_failed,
    served_then_gpu_oom,
    served_then_killed,
)
from nodes.domain.diagnosis.signatures import SIGNATURES
from nodes.domain.diagnosis.startup import (
    engine_ready_timeout,
    health_check_failure,
    killed_while_starting,
    router_timeout,
    startup_timeout,
)
from nodes.domain.diagnosis.vllm import (
    kv_cache_too_small,
    kv_needed_v1,
    no_cache_blocks,
    vllm_gpu_occupied,
)


def leaked_after_cleanup(bundle: Bundle) -> Diagnosis | None:
    """The latest snapshot is after a cleanup (FORMAT.md: it sets the question): GPU memory used
    with no process, and host memory that did not come back (``gpu_holders.cleanup_leak``). Why
    the launch failed before the cleanup is what the rules find without that snapshot."""
    leak = cleanup_leak(bundle)
    if leak is None:
        return None
    before_cleanup = {**bundle.facts, "snapshots": bundle.facts["snapshots"][:-1]}
    earlier = diagnose(bundle.log.source, before_cleanup, bundle.flags)
    return leak_diagnosis(leak, earlier)


def survivors_after_cleanup(bundle: Bundle) -> Diagnosis | None:
    """The latest snapshot is after a cleanup and a process of this launch is still there:
    uninterruptible (``D``, stuck in the kernel, e.g. unpinning host memory), defunct (``Z``)
    or re-parented to PID 1 (``gpu_holders.cleanup_survivors``). Why the launch failed before
    the cleanup is what the rules find without that snapshot."""
    found = cleanup_survivors(bundle)
    if found is None:
        return None
    before_cleanup = {**bundle.facts, "snapshots": bundle.facts["snapshots"][:-1]}
    earlier = diagnose(bundle.log.source, before_cleanup, bundle.flags)
    return survivors_diagnosis(bundle, found, earlier)


RULES: Sequence[Rule] = (
    kv_cache_too_small,
    kv_needed_v1,
    no_cache_blocks,
    vllm_gpu_occupied,
    exec_failed,
    model_not_found,
    survivors_after_cleanup,
    leaked_after_cleanup,
    mem_fraction_window,
    gpu_oom_cuda_graph,
    gpu_held_at_oom,
    gpu_held_outside_at_oom,
    oom_loading_weights,
    health_check_failure,
    startup_timeout,
    engine_ready_timeout,
    router_timeout,
    store_rendezvous,
    interface_missing,
    nccl_versions_differ,
    rank_died_in_init,
    nccl_init_hang,
    nccl_shm,
    shm_insufficient,
    gloo_loopback,
    startup_collective_timeout,
    *SIGNATURES,
    tp_divisibility,
    block_divisibility,
    tp_gpu_mapping,
    host_precheck,
    mem_fraction_too_low,
    gpu_unbalanced,
    oom_beyond_the_weights,
    port_in_use,
    port_bind_in_use,
    dist_store_in_use,
    host_oom_cgroup,
    host_oom_hicache,
    host_oom_pinned,
    kv_pool_exhausted,
    killed_while_starting,
    served_then_gpu_oom,
    parted_while_serving,
    served_then_failed,
    gpu_held_hidden,
    served_then_killed,
    p2p_hang,
)


#: The line that alone shows a rule's failure, whatever its figures say (evidence first): a
#: rule that cannot read a figure of it still names the category (``_unreadable``). Each rule
#: module says which of its rules a line recognises; the map is in the order rules are tried.
_RECOGNISES: Mapping[Rule, tuple[str, re.Pattern[str]]] = {
    **exec_failure.RECOGNISES,
    **gpu_memory.RECOGNISES,
    **host_memory.RECOGNISES,
    **kv_pool.RECOGNISES,
    **launch_settings.RECOGNISES,
    **multinode.RECOGNISES,
    **nccl.RECOGNISES,
    **node_setup.RECOGNISES,
    **ports.RECOGNISES,
    **startup.RECOGNISES,
    **vllm.RECOGNISES,
}
RECOGNISED_BY: Mapping[Rule, tuple[str, re.Pattern[str]]] = {
    rule: _RECOGNISES[rule] for rule in RULES if rule in _RECOGNISES
}


def _unreadable(bundle: Bundle, rule: Rule, exc: Exception) -> Diagnosis | None:
    """``rule`` raised reading its figures: its category, from the line that shows it, with
    the figure it could not compute said; ``None`` where no such line is in the log."""
    category, pattern = RECOGNISED_BY.get(rule, ("", None))
    hit = bundle.log.first(pattern) if pattern is not None else None
    if hit is None:
        return None
    what = str(exc).split("\n")[0][:120] or type(exc).__name__
    return Diagnosis(
        category=category,
        summary=(
            f"{category}: the log shows it (line {hit[0]}), but a figure of it could not be "
            f"read ({what}), so the arithmetic is not computed"
        ),
        remedy=(
            "read the quoted line for the sizes; the category's usual fix applies once they are "
            "known (see the line)"
        ),
        evidence=[bundle.evidence(hit)],
    )


# facts.json's shape (tests/fixtures/cases/FORMAT.md), for _clean.
RECORD_LISTS = {"snapshots", "gpus", "processes", "gpu_processes", "listening_ports", "interfaces"}


TEXT_LISTS = {"notes", "kernel_log", "command"}


OBJECTS = {"node", "env", "exit", "meminfo", "cgroup_memory", "shm", "network", "files"}


OPAQUE = {"model_config", "extra"}


NUMBERS = {
    *("host_ram_bytes", "memory_total_bytes", "memory_used_bytes", "used_memory_bytes"),
    *("max_bytes", "current_bytes", "size_bytes", "used_bytes", "model_weights_bytes"),
    *("MemTotal", "MemAvailable", "HugePages_Total", "HugePages_Free", "Hugepagesize"),
    *("pid", "ppid", "gpu_index", "index", "port", "elapsed_s", "nodes_in_launch", "code"),
}


TEXTS = {"state", "name", "cmdline", "phase", "ipv4", "uuid", "taken_at", "signal"}


def clean_facts(facts: Any) -> dict[str, Any]:
    """``facts.json`` in the shape the rules read (``_clean``): wrong-typed entries absent."""
    cleaned = _clean(facts if isinstance(facts, Mapping) else {})
    return cleaned if isinstance(cleaned, dict) else {}


def engine_of(facts: Mapping[str, Any]) -> str:
    """``vllm`` or ``sglang``: the bundle's ``engine`` (any case), else what its command runs."""
    return "vllm" if Bundle(Log(""), facts, {}).vllm else "sglang"


def _clean_group(facts: dict[str, Any]) -> dict[str, Any]:
    """``facts`` with each node of ``extra.group`` (a multi-node bundle's nodes) holding its
    snapshots in the shape the rules read, as ``_clean`` leaves the top-level ones."""
    extra = facts.get("extra")
    group = extra.get("group") if isinstance(extra, dict) else None
    if isinstance(extra, dict) and isinstance(group, list):
        extra["group"] = [
            {**entry, "snapshots": _clean(entry.get("snapshots"), "snapshots")}
            for entry in group
            if isinstance(entry, Mapping)
        ]
    return facts


def _clean(value: Any, key: str = "") -> Any:
    """``facts`` in the shape the rules read: a wrong-typed or ``None`` entry becomes absent
    (``None``, ``{}``, ``[]``), so no rule has to guard against it."""
    if key in NUMBERS:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        # Beyond 10^18 no memory size, PID or port is real; it would only overflow floats.
        return value if ok and abs(value) < 1e18 and math.isfinite(value) else None
    if key in TEXTS:
        return value if isinstance(value, str) else None
    if key in RECORD_LISTS:
        items = value if isinstance(value, list) else []
        return [_clean(item, "*") for item in items if isinstance(item, Mapping)]
    if key in TEXT_LISTS:
        items = value if isinstance(value, list) else []
        return [str(item) for item in items if item is not None]
    if key in OPAQUE:
        return dict(value) if isinstance(value, Mapping) else None
    if key == "env":
        pairs = value if isinstance(value, Mapping) else {}
        return {str(k): str(v) for k, v in pairs.items() if v is not None}
    if isinstance(value, Mapping):
        return {str(k): _clean(v, str(k)) for k, v in value.items()}
    if key in OBJECTS or key == "*":
        return {}
    return value


def diagnose(log_text: str, facts: Mapping[str, Any], flags: Mapping[str, Any]) -> Diagnosis:
    """The diagnosis of one bundle. ``flags`` are the command's values by dest, as the node's
    SGLang version parses them (``sglang_flags.parse_command(...).values``); never raises."""
    cleaned = _clean_group(_clean(facts if isinstance(facts, Mapping) else {}))
    bundle = Bundle(
        Log(log_text if isinstance(log_text, str) else "", [n.name for n in group_of(cleaned)]),
        cleaned,
        dict(flags) if isinstance(flags, Mapping) else {},
    )
    for rule in RULES:
        try:
            found = rule(bundle)
        except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as exc:
            # A figure the rule cannot read (a number it cannot parse, a shape it does not
            # know): where the failure's own line is in the log, it is still that failure, said
            # without the figure; else it is no evidence, and the next rule answers.
            found = _unreadable(bundle, rule, exc)
        if found is not None:
            return _located(bundle, found)
    # No rule read the failure; a line that shows one whose figures no rule could read (a
    # negative size, 1e400 GiB) still names it.
    for rule in RECOGNISED_BY:
        found = _unreadable(bundle, rule, ValueError("its figures are not in a form a rule reads"))
        if found is not None:
            return _located(bundle, found)
    return _located(
        bundle,
        Diagnosis(
            category="unknown",
            summary="no known failure signature or memory arithmetic explains this launch",
            remedy=(
                "collect more evidence: the full server log from every rank, `dmesg -T | grep -i "
                "-E 'oom|killed process'` on the node, nvidia-smi with its processes, and "
                "MemAvailable before and after the launch"
            ),
        ),
    )


def _located(bundle: Bundle, found: Diagnosis) -> Diagnosis:
    """``found`` with its node named on a multi-node bundle (``multinode.locate``); as it is
    when the group cannot be read."""
    try:
        return locate(bundle, found)
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError):
        return found
