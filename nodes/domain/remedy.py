"""A diagnosis's remedy as flag changes a new profile revision can take in one click.

A change maps an option to its new value: a string or number to set it, ``True`` to add a
switch, ``None`` to drop the flag. Which figure of a diagnosis becomes which flag is data
(``SUGGESTED``); the budget engine's own suggestion, when it has one, wins, because it is the
arithmetic the new revision is re-validated with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nodes.domain.sglang_flags import LIST_DESTS, FlagSpec, FlagTable

Change = dict[str, Any]

#: category → (option, key of ``numbers`` holding its suggested value).
SUGGESTED: Mapping[str, Sequence[tuple[str, str]]] = {
    "host-oom-hicache": (("--hicache-size", "suggested_hicache_size_gb"),),
    "host-mem-precheck": (("--hicache-size", "suggested_hicache_size_gb"),),
    "host-oom-cgroup": (("--hicache-size", "suggested_hicache_size_gb"),),
    "mem-fraction-too-low": (("--mem-fraction-static", "suggested_mem_fraction_static"),),
    "mem-fraction-too-high": (("--mem-fraction-static", "suggested_mem_fraction_static"),),
    "gpu-oom-cuda-graph": (
        ("--mem-fraction-static", "suggested_mem_fraction_static"),
        ("--cuda-graph-max-bs", "suggested_cuda_graph_max_bs"),
    ),
    "tp-divisibility": (("--tp-size", "suggested_tp_size"),),
    "gpu-oom-weights": (("--tp-size", "suggested_tp_size"),),
    "tp-gpu-mapping": (("--base-gpu-id", "max_valid_base_gpu_id"),),
}
#: vLLM's figures (its rules name them apart from SGLang's), by category.
SUGGESTED_VLLM: Mapping[str, Sequence[tuple[str, str]]] = {
    "gpu-oom-kv-cache": (("--max-model-len", "suggested_max_model_len"),),
    "mem-fraction-too-low": (("--gpu-memory-utilization", "suggested_gpu_memory_utilization"),),
    "mem-fraction-too-high": (("--gpu-memory-utilization", "suggested_gpu_memory_utilization"),),
    "gpu-oom-cuda-graph": (("--gpu-memory-utilization", "suggested_gpu_memory_utilization"),),
    "tp-divisibility": (("--tensor-parallel-size", "suggested_tp_size"),),
    "gpu-oom-weights": (("--tensor-parallel-size", "suggested_tp_size"),),
}
#: Removing hierarchical cache (its host pool keeps prefixes only; before SGLang 0.5.13 it must
#: outgrow the device pool, which can force ``--mem-fraction-static`` down): the switch and its
#: size, as the budget, the planner and the capacity advisor offer it.
WITHOUT_HICACHE: Change = {"--enable-hierarchical-cache": None, "--hicache-size": None}
#: category → switches its remedy adds.
SWITCHES: Mapping[str, Change] = {"trust-remote-code": {"--trust-remote-code": True}}
#: Budget suggestions that answer a category (the budget engine does host and device pools).
BUDGET_ANSWERS = {
    "host-oom-hicache",
    "host-mem-precheck",
    "host-oom-cgroup",
    "mem-fraction-too-low",
}


def changes_for(
    category: str,
    numbers: Mapping[str, Any],
    budget_suggestion: Mapping[str, Any] | None = None,
    *,
    engine: str = "sglang",
) -> Change:
    """The flag changes that carry out the remedy of a ``category`` diagnosis, spelled as
    ``engine`` (``sglang`` or ``vllm``) spells them; ``{}`` when the remedy is not a flag change
    (a cleanup, a reboot, a bigger /dev/shm)."""
    changes: Change = dict(SWITCHES.get(category, {}))
    table = SUGGESTED_VLLM if engine == "vllm" else SUGGESTED
    for option, key in table.get(category, ()):
        value = numbers.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            changes[option] = plain(value)
    if budget_suggestion and category in BUDGET_ANSWERS:
        changes.update({k: plain(v) for k, v in budget_suggestion.items()})
    return changes


def plain(value: Any) -> Any:
    """A whole float as an int (``37.0`` → ``37``), as a command spells it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def describe(changes: Mapping[str, Any]) -> str:
    """``--hicache-size 37 --trust-remote-code`` (a dropped flag reads ``without --flag``)."""
    words = []
    for option, value in changes.items():
        if value is None:
            words.append(f"without {option}")
        elif value is True:
            words.append(option)
        else:
            words.append(f"{option} {value}")
    return " ".join(words)


def with_changes(args: Sequence[str], changes: Mapping[str, Any], table: FlagTable) -> list[str]:
    """``args`` with every flag of ``changes`` replaced (all spellings of the same option: its
    aliases, ``--opt=value``), then set at the end. Raises ``ValueError`` for an option the
    version does not have."""
    out = list(args)
    for option, value in changes.items():
        spec = next((f for f in table.flags if option in f.options), None)
        if spec is None:
            raise ValueError(f"{option} is not a flag of SGLang {table.version}")
        out = _without(out, spec, table)
        if value is True:
            out.append(option)
        elif value is not None and value is not False:
            out += [option, str(value)]
    return out


SWITCH_ACTIONS = ("_StoreTrueAction", "DeprecatedStoreTrueAction", "DeprecatedAction")


def _without(args: list[str], spec: FlagSpec, table: FlagTable) -> list[str]:
    """``args`` without the option of ``spec`` in any spelling (an abbreviation argparse takes
    for it too: ``--hicache-si``), and without its value(s)."""
    every = [o for f in table.flags for o in f.options]

    def spells(name: str) -> bool:
        if name in names:
            return True
        if not name.startswith("--") or name in every:
            return False
        matches = [o for o in every if o.startswith(name)]
        return len(matches) == 1 and matches[0] in spec.options

    switch = spec.action in SWITCH_ACTIONS or spec.action in (
        "DeprecatedStoreConstAction",
        "BooleanOptionalAction",
    )
    many = spec.dest in LIST_DESTS or spec.action == "LoRAPathAction"
    names = set(spec.options) | {"--no-" + o[2:] for o in spec.options if o.startswith("--")}
    out: list[str] = []
    skip = False
    for word in args:
        if skip:
            if word.startswith("-") and not _number(word):
                skip = False
            elif not many:
                skip = False
                continue
            else:
                continue
        name = word.split("=", 1)[0]
        if spells(name):
            skip = not switch and "=" not in word
            continue
        out.append(word)
    return out


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True
