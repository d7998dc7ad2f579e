"""The planner: for an expected workload (average input and output tokens per request and a
target number of requests at once) the settings that reach it on a node, or why none does,
from the budget's own arithmetic (its device KV pool per rank at those settings).

Why the device pool decides: SGLang admits a waiting request only while the *device* KV pool
can hold its input and what it is still expected to generate (``PrefillAdder`` in
``srt/managers/schedule_policy.py``), and a running request's KV stays on the device to its
end, so a pool holds at most ``pool ÷ (input + output)`` whole requests at once. A host pool
(HiCache) holds evicted prefixes, not running requests, so it is never a way to reach a
concurrency; neither are lower ``--context-length`` or ``--max-running-requests``, which cap
requests, not add room.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nodes.domain.capacity import FP8_KV, MAX_MFS, Checked
from nodes.domain.remedy import WITHOUT_HICACHE

#: The planner's bounds on what an operator types (tokens per request; requests at once).
MAX_TOKENS = 10_000_000
MAX_CONCURRENCY = 100_000
#: The planner's step of --mem-fraction-static (each costs one budget check).
MFS_STEP = 0.02
#: KV cache dtypes that hold two bytes a value (an fp8 cache holds twice the tokens).
WIDE_KV = ("auto", "bfloat16", "float16", "bf16", "fp16", "")


@dataclass(frozen=True)
class Workload:
    """Average tokens in and out per request, and the requests wanted at once."""

    input_tokens: int
    output_tokens: int
    concurrency: int

    def __post_init__(self) -> None:
        for name, value, high in (
            ("input tokens", self.input_tokens, MAX_TOKENS),
            ("output tokens", self.output_tokens, MAX_TOKENS),
            ("requests at once", self.concurrency, MAX_CONCURRENCY),
        ):
            if not 1 <= value <= high:
                raise ValueError(f"{name} must be a whole number from 1 to {high:,}")

    @property
    def tokens_per_request(self) -> int:
        """What a request holds in the device pool at its end: its input and all it made."""
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class Plan:
    """One setting tried: the change (as ``diagnose --json``'s; ``{}`` is the revision as it
    is), the budget's verdict, its device pool (tokens per rank), the whole requests that pool
    holds at once, whether that reaches the target, and why in words."""

    change: dict[str, Any]
    verdict: str
    pool_tokens: int | None
    requests_that_fit: int
    reaches: bool
    why: str


def changes_to_try(
    *, mfs: float | None, kv_dtype: str, tp: int, gpus: int, hicache: bool = False
) -> list[dict[str, Any]]:
    """The changes the planner weighs, least change first: none; a higher
    ``--mem-fraction-static`` (steps of ``MFS_STEP`` up to ``MAX_MFS``, which is always
    tried); an fp8 KV cache (alone and with each of those fractions); more GPUs for tensor
    parallelism (powers of two up to the node's count), alone and with the fp8 KV cache; with
    ``hicache`` on, removing it (alone and with each of those fractions). A fraction outside
    (0, ``MAX_MFS``) or a TP size below 1 (which the budget blocks anyway) adds no step of its
    own."""
    found: list[dict[str, Any]] = [{}]
    steps: list[int] = []
    if mfs is not None and math.isfinite(mfs) and 0 < mfs < MAX_MFS:
        top, step = round(MAX_MFS * 100), round(MFS_STEP * 100)
        steps = list(range(round(mfs * 100) + step, top, step)) + [top]
    found += [{"--mem-fraction-static": step / 100} for step in steps]
    if kv_dtype in WIDE_KV:
        found.append({"--kv-cache-dtype": FP8_KV})
        found += [{"--kv-cache-dtype": FP8_KV, "--mem-fraction-static": s / 100} for s in steps]
    wider = tp * 2
    while 2 <= wider <= gpus:
        found.append({"--tp-size": wider})
        if kv_dtype in WIDE_KV:
            found.append({"--tp-size": wider, "--kv-cache-dtype": FP8_KV})
        wider *= 2
    if hicache:
        found.append(dict(WITHOUT_HICACHE))
        found += [{**WITHOUT_HICACHE, "--mem-fraction-static": s / 100} for s in steps]
    return found


def plan(
    workload: Workload,
    changes: list[dict[str, Any]],
    check: Callable[[dict[str, Any]], Checked],
) -> list[Plan]:
    """Each change checked by ``check`` (the budget of the revision with it, on the node); the
    ones the budget blocks are dropped. Order: the first that reaches the target (least change:
    the order of ``changes``, a clean verdict before a warning), then for each kind of change
    (the same flags) the one holding the most requests. Once a kind reaches the target with a
    clean verdict, its larger steps are not checked. ``[]`` when the budget blocks every one."""
    tried: list[Plan] = []
    settled: set[frozenset[str]] = set()
    for change in changes:
        if frozenset(change) in settled:
            continue
        checked = check(change)
        if checked.verdict == "block" or not checked.pool_tokens:
            continue
        fit = math.floor(checked.pool_tokens / workload.tokens_per_request)
        reaches = fit >= workload.concurrency
        risk = f"; {checked.warnings[0]}" if checked.warnings and checked.verdict == "warn" else ""
        why = (
            f"{checked.pool_tokens:,} device tokens ÷ {workload.tokens_per_request:,} tokens a "
            f"request = {fit:,} requests at once"
            + (" (reaches the target)" if reaches else f", short of {workload.concurrency:,}")
            + risk
        )
        tried.append(Plan(change, checked.verdict, checked.pool_tokens, fit, reaches, why))
        if reaches and checked.verdict == "ok":
            settled.add(frozenset(change))
    reaching = sorted(
        (p for p in tried if p.reaches), key=lambda p: p.verdict != "ok"
    )  # stable: least change first within a verdict
    best: dict[frozenset[str], Plan] = {}
    for p in tried:
        kind = frozenset(p.change)
        if kind not in best or p.requests_that_fit > best[kind].requests_that_fit:
            best[kind] = p
    shown = reaching[:1] + sorted(best.values(), key=lambda p: -p.requests_that_fit)
    unique: list[Plan] = []
    for p in shown:
        if p not in unique:
            unique.append(p)
    return unique
