"""A running server's capacity from its metrics: what bounds it now (the bottleneck), the
figures it rests on, and what a change of its settings would lift it to.

What SGLang does, from its source:

- A waiting request is admitted only while the **device** KV pool can hold it: the scheduler's
  ``PrefillAdder`` budgets the token pool allocator's free and evictable tokens, less what every
  running request is still expected to need (its ``max_new_tokens`` × ``new_token_ratio``), and
  stops adding with ``NO_TOKEN`` when a request's input does not fit
  (``srt/managers/schedule_policy.py``: ``PrefillAdder``, ``memory_budget``,
  ``_get_running_request_total_token_offset``). A full device pool therefore keeps requests
  queued whatever the host holds; under pressure running requests are retracted
  (``ScheduleBatch.retract_decode``, logged as ``Decode out of memory happened … #retracted_reqs``).
- HiCache (``--enable-hierarchical-cache``) is ``HiRadixCache``: prefix KV evicted from the device
  pool is kept in host memory and loaded back on a hit (``srt/mem_cache/hiradix_cache.py``;
  the adder counts those tokens as ``log_host_hit_tokens``). It raises the prefix *hit rate*,
  i.e. saves prefill work on shared prefixes; the KV of a running request lives in the device
  pool, so HiCache does not raise how many requests run at once.
- The gauges are ``sglang:token_usage`` (fraction of the device pool in use),
  ``num_running_reqs``, ``num_queue_reqs``, ``gen_throughput`` (tokens/s), ``cache_hit_rate``,
  ``num_retracted_reqs`` (shared/reference/sglang.md §5).

A bottleneck is named only once its pattern has held for ``HOLD_S`` seconds of samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nodes.domain.remedy import WITHOUT_HICACHE
from nodes.domain.units import GB

#: How long a pattern must hold before it is named (s).
HOLD_S = 30.0
#: The device pool counts as full from this share of its tokens in use (SGLang admits against
#: what running requests may still need, so a pool reads full before it is at 1.0).
KV_FULL = 0.85
#: "Well below max_running_requests": running at most this share of the limit.
BELOW_LIMIT = 0.8
#: Compute-bound: the pool this empty while this share of the running limit runs.
KV_LOW, BUSY = 0.5, 0.8
#: Prefill-bound: time to first token this long (s) with at most this many waiting.
TTFT_LONG_S, SHORT_QUEUE = 2.0, 2
#: With HiCache on, a prefix hit rate below this is low: the host pool does not pay.
LOW_HIT_RATE = 0.1

BOTTLENECKS = ("kv-bound", "compute-bound", "prefill-bound", "preemption", "host-pool", "none")


@dataclass(frozen=True)
class Sample:
    """The server's gauges at ``t`` seconds (``None``: the server did not say)."""

    t: float
    token_usage: float | None = None
    running: float | None = None
    queued: float | None = None
    gen_throughput: float | None = None
    cache_hit_rate: float | None = None
    ttft_s: float | None = None
    retracted: float | None = None  # cumulative requests retracted (counter or log lines)
    # Prompt + generated tokens per request finished over the interval (the counters
    # prompt_tokens_total, generation_tokens_total, num_requests_total): a whole request.
    request_tokens: float | None = None

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Sample:
        """From a stored sample (``{"t", "token_usage", "num_running_reqs", …}``); a figure
        that is not a finite number reads as ``None``."""

        def number(key: str) -> float | None:
            value = doc.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                return None
            # Every figure here is a count, a share or a time: never negative, never huge.
            ok = math.isfinite(value) and 0 <= value <= 1e15
            return float(value) if ok else None

        return cls(
            t=number("t") or 0.0,
            token_usage=number("token_usage"),
            running=number("num_running_reqs"),
            queued=number("num_queue_reqs"),
            gen_throughput=number("gen_throughput"),
            cache_hit_rate=number("cache_hit_rate"),
            ttft_s=number("ttft_s"),
            retracted=number("num_retracted_reqs"),
            request_tokens=number("request_tokens"),
        )


@dataclass(frozen=True)
class Server:
    """What the server runs with: ``pool_tokens`` (``max_total_num_tokens``, the device pool),
    ``max_running_requests`` (``None``: SGLang's own limit, not known here), HiCache on."""

    pool_tokens: int | None
    max_running_requests: int | None = None
    hicache: bool = False
    #: Data-parallel replicas and the GPUs the server takes on its node (``None``: not said).
    dp: int = 1
    gpus: int | None = None


@dataclass
class Capacity:
    """The bottleneck (one of ``BOTTLENECKS``, or ``unknown`` without enough metrics), how long
    its pattern has held (s), the figures it rests on, and why in words."""

    bottleneck: str
    held_s: float = 0.0
    figures: dict[str, float] = field(default_factory=dict)
    why: str = ""


#: What each pattern looks like while it builds, in words.
BUILDING = {
    "kv-bound": "requests have waited at a full device KV pool",
    "preemption": "running requests have been retracted",
    "compute-bound": "the batch has been at its running limit with the pool half empty",
    "prefill-bound": "the first token has taken long with hardly a queue",
    "host-pool": "HiCache has found almost no shared prefixes under load",
}


def bottleneck(samples: Sequence[Sample], server: Server, *, ended: bool = False) -> Capacity:
    """What bounds the server over its latest samples: the pattern that has held for at
    least ``HOLD_S`` (the first that does, in ``BOTTLENECKS`` order); ``unknown`` while one
    that comes first still builds (the load's first seconds: a full pool is not yet named, and
    nothing after it is named instead); ``none`` when nothing waits; ``unknown`` with fewer
    samples or figures than that takes. For a server that has ``ended``, the verdict is that of
    its last loaded period (the idle tail after the load is left out)."""
    known = sorted(
        (s for s in samples if s.running is not None and s.queued is not None),
        key=lambda s: s.t,
    )
    if ended:
        known = _loaded(known)
    if len(known) < 2 or known[-1].t - known[0].t < HOLD_S:
        return Capacity("unknown", why=f"fewer than {HOLD_S:g} s of load figures yet")
    windows: tuple[tuple[str, Callable[[Sequence[Sample]], list[Sample]]], ...] = (
        ("kv-bound", lambda run: _trailing(run, lambda s: _kv_bound(s, server))),
        ("preemption", _retracting),
        ("compute-bound", lambda run: _trailing(run, lambda s: _compute_bound(s, server))),
        ("prefill-bound", lambda run: _trailing(run, _prefill_bound)),
        ("host-pool", lambda run: _trailing(run, lambda s: _low_hits(s, server))),
    )
    for name, window_of in windows:
        window = window_of(known)
        if not window:
            continue
        held = window[-1].t - window[0].t
        if held >= HOLD_S:
            return Capacity(name, held, _figures(window, server))
        if window[-1] is known[-1]:
            why = f"{BUILDING[name]} for {held:g} s; it is named {name} once that holds"
            why += f" {HOLD_S:g} s"
            return Capacity("unknown", held, _figures(window, server), why)
    quiet = _trailing(known, lambda s: (s.queued or 0) == 0)
    figures = _figures(known[-max(2, len(quiet)) :], server)
    return Capacity("none", quiet[-1].t - quiet[0].t if quiet else 0.0, figures)


def _kv_bound(s: Sample, server: Server) -> bool:
    """Requests wait while the device pool is full and fewer run than the server's limit."""
    if s.queued is None or s.token_usage is None or s.running is None:
        return False
    limit = server.max_running_requests
    below = limit is None or s.running <= BELOW_LIMIT * limit
    return s.queued > 0 and s.token_usage >= KV_FULL and below


def _compute_bound(s: Sample, server: Server) -> bool:
    """The pool has room and the batch is near the running limit: the GPUs are the limit."""
    limit = server.max_running_requests
    if s.token_usage is None or s.running is None or limit is None:
        return False
    return s.token_usage < KV_LOW and s.running >= BUSY * limit


def _prefill_bound(s: Sample) -> bool:
    return (
        s.ttft_s is not None
        and s.ttft_s >= TTFT_LONG_S
        and s.queued is not None
        and s.queued <= SHORT_QUEUE
    )


def _low_hits(s: Sample, server: Server) -> bool:
    """HiCache on, requests running or waiting, and almost no prefix hits: the host pool does
    not pay. An idle server has no hits to find, so it says nothing of the host pool."""
    loaded = (s.running or 0) > 0 or (s.queued or 0) > 0
    low = s.cache_hit_rate is not None and s.cache_hit_rate < LOW_HIT_RATE
    return server.hicache and loaded and low


def _loaded(samples: Sequence[Sample]) -> list[Sample]:
    """The samples up to the last one under load (requests running or waiting): a stopped
    server is judged by its load, not by the quiet after it. All of them when none was."""
    last = max(
        (i for i, s in enumerate(samples) if (s.running or 0) > 0 or (s.queued or 0) > 0),
        default=len(samples) - 1,
    )
    return list(samples[: last + 1])


def _trailing(samples: Sequence[Sample], holds: Callable[[Sample], bool]) -> list[Sample]:
    """The latest run of samples for which ``holds`` is true, oldest first."""
    run: list[Sample] = []
    for sample in reversed(samples):
        if not holds(sample):
            break
        run.append(sample)
    return run[::-1]


def _retracting(samples: Sequence[Sample]) -> list[Sample]:
    """The latest run over which the retraction counter kept rising (each step within
    ``HOLD_S``)."""
    counted = [s for s in samples if s.retracted is not None]
    run: list[Sample] = []
    for later, earlier in zip(counted[::-1], counted[::-1][1:], strict=False):
        if (later.retracted or 0) <= (earlier.retracted or 0) or later.t - earlier.t > HOLD_S:
            break
        run = [earlier, later] if not run else [earlier, *run]
    return run


def _figures(window: Sequence[Sample], server: Server) -> dict[str, float]:
    """Means over ``window``: running, queued, token usage, throughput; with the pool's size,
    the tokens an average running request holds and how many such requests the pool fits."""

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) / len(known) if known else None

    figures: dict[str, float] = {}
    for key, values in (
        ("running", [s.running for s in window]),
        ("queued", [s.queued for s in window]),
        ("token_usage", [s.token_usage for s in window]),
        ("gen_throughput", [s.gen_throughput for s in window]),
        ("cache_hit_rate", [s.cache_hit_rate for s in window]),
        ("ttft_s", [s.ttft_s for s in window]),
    ):
        if (value := mean(values)) is not None:
            figures[key] = round(value, 3)
    pool = server.pool_tokens
    if pool:
        figures["pool_tokens"] = pool
        per = [
            s.token_usage * pool / s.running
            for s in window
            if s.token_usage is not None and s.running
        ]
        if per:
            average = sum(per) / len(per)
            figures["avg_tokens_per_request"] = round(average)
            figures["requests_that_fit"] = math.floor(pool / average) if average else 0
        whole = mean([s.request_tokens for s in window])
        if whole:
            # What a request holds once it has generated all it will: how many fit at once.
            figures["tokens_per_whole_request"] = round(whole)
            figures["whole_requests_that_fit"] = math.floor(pool / whole)
    if server.max_running_requests:
        figures["max_running_requests"] = server.max_running_requests
    return figures


@dataclass(frozen=True)
class Option:
    """A change of the server's flags (as ``diagnose --json``'s ``change``), the budget's
    verdict on the revision with it, the requests expected to run at once and the throughput
    change (a ratio: 1.4 is +40 %), and why, in words."""

    change: dict[str, Any]
    verdict: str
    expected_running_requests: int
    expected_throughput_change: float
    why: str


def expected_running(
    capacity: Capacity, pool_after: float, server: Server
) -> tuple[int, float] | None:
    """Requests that would run at once with a device pool of ``pool_after`` tokens, at the
    measured tokens per request, no more than wait now (running + queued) nor the server's
    limit; and the throughput change that follows (decode throughput of a KV-bound server
    grows with its batch: ratio of running requests). ``None`` without the figures."""
    figures = capacity.figures
    average, running = figures.get("avg_tokens_per_request"), figures.get("running")
    if not average or not running:
        return None
    demand = running + figures.get("queued", 0.0)
    limit = server.max_running_requests or math.inf
    after = min(math.floor(pool_after / average), demand, limit)
    return int(after), round(after / running, 2)


#: What a check of a changed revision gives back: its verdict, the device pool per rank it
#: estimates (tokens), and its warnings (``budget.check``'s report reduced to what is used).
@dataclass(frozen=True)
class Checked:
    verdict: str
    pool_tokens: int | None
    warnings: tuple[str, ...] = ()
    #: The node's host budget for pinned pools (bytes) and the ranks on the node, where the
    #: budget computed them (it does for a revision with HiCache).
    host_budget_bytes: int | None = None
    ranks_per_node: int | None = None


#: The highest --mem-fraction-static offered (SGLang keeps the rest for activations and graphs).
MAX_MFS = 0.95
#: The fp8 KV cache dtype offered (SGLang's --kv-cache-dtype choice).
FP8_KV = "fp8_e5m2"


def options(
    capacity: Capacity,
    server: Server,
    *,
    mfs: float | None,
    kv_dtype: str,
    recheck: Callable[[dict[str, Any]], Checked],
    node_gpus: int | None = None,
) -> list[Option]:
    """What would lift a KV-bound server, each checked by ``recheck`` (the budget of the
    revision with the change, on the launch's node) before it is offered, and none that the
    check blocks: the highest ``--mem-fraction-static`` it passes (ok before warn), and an fp8
    KV cache; and, where prefixes are shared, a host pool that fits (``_host_pool_option``).
    The device pool after a change is the measured pool scaled by the budget's own estimates
    (after ÷ now), so an estimate's error cancels. For a prefill-bound server only the host
    pool; ``[]`` for other bottlenecks: a larger pool does not lift them."""
    if capacity.bottleneck == "prefill-bound":
        return _host_pool_option(capacity, server, recheck)
    if capacity.bottleneck == "preemption":
        return _admission_cap(capacity, server, recheck)
    if capacity.bottleneck != "kv-bound" or not server.pool_tokens:
        return []
    now = recheck({})
    if not now.pool_tokens:
        return []
    found = []
    if mfs is not None and (chosen := _highest_fraction(round(mfs * 100) + 1, recheck)):
        x, checked = chosen
        found += _option(capacity, server, {"--mem-fraction-static": x}, checked, now,
                         f"raise --mem-fraction-static from {mfs:g} to {x:g}")  # fmt: skip
    if kv_dtype in ("auto", "bfloat16", "float16", "bf16", "fp16", ""):
        checked = recheck({"--kv-cache-dtype": FP8_KV})
        found += _option(capacity, server, {"--kv-cache-dtype": FP8_KV}, checked, now,
                         "an fp8 KV cache holds twice the tokens in the same memory; fp8 KV can "
                         "cost some accuracy (check the model's evals)")  # fmt: skip
    found += _without_hicache(capacity, server, mfs, now, recheck)
    found += _replicas(capacity, server, now, recheck, node_gpus)
    return found + _host_pool_option(capacity, server, recheck)


def _without_hicache(
    capacity: Capacity,
    server: Server,
    mfs: float | None,
    now: Checked,
    recheck: Callable[[dict[str, Any]], Checked],
) -> list[Option]:
    """Removing HiCache, with the highest ``--mem-fraction-static`` the budget then passes: the
    host pool often forced the fraction down (before 0.5.13 it must outgrow the device pool),
    and it keeps only prefixes, which pay little at a low hit rate."""
    if not server.hicache or mfs is None:
        return []
    if not (chosen := _highest_fraction(round(mfs * 100), recheck, WITHOUT_HICACHE)):
        return []
    x, checked = chosen
    hits = capacity.figures.get("cache_hit_rate")
    said = f"a prefix hit rate of {hits:.0%}" if hits is not None else "no prefix hit rate read"
    what = (
        f"remove HiCache ({said}: the host pool keeps prefixes only) and raise "
        f"--mem-fraction-static from {mfs:g} to {x:g}"
        if x > mfs
        else f"remove HiCache ({said}: the host pool keeps prefixes only)"
    )
    return _option(
        capacity, server, {**WITHOUT_HICACHE, "--mem-fraction-static": x}, checked, now, what
    )


def _highest_fraction(
    first: int,
    recheck: Callable[[dict[str, Any]], Checked],
    with_change: dict[str, Any] | None = None,
) -> tuple[float, Checked] | None:
    """The highest ``--mem-fraction-static`` from ``first`` hundredths to ``MAX_MFS``, with
    ``with_change``, that the budget passes with a pool: the highest ``ok`` one, else the
    highest ``warn`` one; None when it blocks them all."""
    tried = [
        (step / 100, recheck({**(with_change or {}), "--mem-fraction-static": step / 100}))
        for step in range(first, round(MAX_MFS * 100) + 1)
    ]
    passing = [(x, c) for x, c in tried if c.verdict != "block" and c.pool_tokens]
    clean = [(x, c) for x, c in passing if c.verdict == "ok"]
    chosen = (clean or passing)[-1:]
    return chosen[0] if chosen else None


def _replicas(
    capacity: Capacity,
    server: Server,
    now: Checked,
    recheck: Callable[[dict[str, Any]], Checked],
    node_gpus: int | None,
) -> list[Option]:
    """Twice the data-parallel replicas, where the node has the GPUs for them: each replica
    has a device pool of its own, so the pool doubles (the launch form's placement then finds
    GPUs free for it, here or on another node)."""
    if not server.gpus or not node_gpus or server.gpus * 2 > node_gpus:
        return []
    change = {"--dp-size": server.dp * 2}
    checked = recheck(change)
    if checked.verdict == "block" or not checked.pool_tokens or not now.pool_tokens:
        return []
    # The budget's pool is per replica; the server's gauges count every replica's requests.
    scaled = Checked(checked.verdict, checked.pool_tokens * 2, checked.warnings)
    return _option(capacity, server, change, scaled, now,
                   f"{server.dp * 2} data-parallel replicas on {server.gpus * 2} GPUs (the "
                   "launch form finds where they are free): each keeps a device pool of its "
                   "own")  # fmt: skip


def _admission_cap(
    capacity: Capacity, server: Server, recheck: Callable[[dict[str, Any]], Checked]
) -> list[Option]:
    """A retracting server admits more requests than its pool holds to their end: cap
    ``--max-running-requests`` at the whole requests (measured prompt + generated tokens per
    finished request) the pool holds, so none is retracted and prefilled again."""
    whole = capacity.figures.get("whole_requests_that_fit")
    limit = server.max_running_requests
    if not whole or whole < 1 or (limit is not None and whole >= limit):
        return []
    change = {"--max-running-requests": int(whole)}
    checked = recheck(change)
    if checked.verdict == "block":
        return []
    running = capacity.figures.get("running", 0.0)
    why = (
        f"about {capacity.figures.get('tokens_per_whole_request', 0):,.0f} tokens a request at "
        f"its end, so {int(whole)} fit the {server.pool_tokens or 0:,}-token pool whole; "
        f"{running:.0f} run now and some are retracted, each prefilled again from its start. "
        "Capping admission there keeps every admitted request to its end (throughput not "
        "estimated: it gains the prefill retractions cost)"
    )
    return [Option(change, checked.verdict, int(whole), 1.0, why)]


#: A prefix hit rate from which shared prefixes are worth keeping in host memory.
SHARED_PREFIX_HITS = 0.2
#: The share of the node's host budget a suggested host pool may take (the rest stays free).
HOST_SHARE = 0.5


def _host_pool_option(
    capacity: Capacity, server: Server, recheck: Callable[[dict[str, Any]], Checked]
) -> list[Option]:
    """HiCache only where it helps: the server is bound by its pool or by prefill, shares
    prefixes (measured hit rate ≥ ``SHARED_PREFIX_HITS``) and has no host pool yet. Sized per
    rank to ``HOST_SHARE`` of the node's host budget over its ranks (``--hicache-size`` is per
    rank), smaller until the budget passes it. It saves prefill on prefixes the device had to
    evict; it does not raise the requests running at once, and says so."""
    hits = capacity.figures.get("cache_hit_rate") or 0.0
    if server.hicache or hits < SHARED_PREFIX_HITS or not capacity.figures.get("running"):
        return []
    if capacity.bottleneck not in ("kv-bound", "prefill-bound"):
        return []
    probe = recheck({"--enable-hierarchical-cache": True, "--hicache-size": 1})
    if not probe.host_budget_bytes or not probe.ranks_per_node:
        return []
    size = math.floor(HOST_SHARE * probe.host_budget_bytes / probe.ranks_per_node / GB)
    while size >= 1:
        change = {"--enable-hierarchical-cache": True, "--hicache-size": size}
        checked = recheck(change)
        if checked.verdict != "block":
            running = round(capacity.figures["running"])
            why = (
                f"a prefix hit rate of {hits:.0%} says requests share prefixes: a host pool of "
                f"{size} GB per rank × {probe.ranks_per_node} ranks = "
                f"{size * probe.ranks_per_node} GB (within the node's host budget of "
                f"{probe.host_budget_bytes / GB:,.0f} GB) keeps prefixes the device evicts, to "
                "be loaded back instead of computed again; it saves prefill, it does not raise "
                f"the {running} requests running at once (their KV stays in the device pool)"
            )
            return [Option(change, checked.verdict, running, 1.0, why)]
        size = size * 3 // 4 if size > 1 else 0
    return []


def _option(
    capacity: Capacity,
    server: Server,
    change: dict[str, Any],
    checked: Checked,
    now: Checked,
    what: str,
) -> list[Option]:
    if checked.verdict == "block" or not checked.pool_tokens or not now.pool_tokens:
        return []
    pool_after = (server.pool_tokens or 0) * checked.pool_tokens / now.pool_tokens
    expected = expected_running(capacity, pool_after, server)
    if expected is None or expected[0] <= (capacity.figures.get("running") or 0):
        return []
    running, ratio = expected
    risk = f"; {checked.warnings[0]}" if checked.warnings else ""
    why = (
        f"{what}: about {pool_after:,.0f} device tokens instead of {server.pool_tokens:,} "
        f"({pool_after / (server.pool_tokens or 1):.2f}×), so about {running} requests run at "
        f"once instead of {capacity.figures.get('running', 0):.0f}{risk}"
    )
    return [Option(change, checked.verdict, running, ratio, why)]
