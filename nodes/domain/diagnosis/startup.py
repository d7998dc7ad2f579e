"""Rules for a server that loaded but never became ready: its warm-up request failed, or ranks
gave up waiting for the others at the post-load barrier."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from nodes.domain.diagnosis.evidence import (
    LOAD_BEGIN,
    LOAD_END,
    RANK_TAG,
    SHARDS,
    Bundle,
    Diagnosis,
    Evidence,
    Hit,
    Rule,
    _prefix,
    _when,
)

WARMUP = re.compile(r"Initialization failed\. warmup error")


WARMUP_STATUS = re.compile(
    r"\"(?:GET|POST) http://[^:/]+:(?P<port>\d+)/\S* HTTP/1\.1\" (?P<status>\d{3})"
)


PROXIED = re.compile(r"res=<Response \[(?P<status>\d{3})\]>")


def health_check_failure(bundle: Bundle) -> Diagnosis | None:
    """The server loaded but its own warm-up request failed, so it killed itself."""
    hit = bundle.log.first(WARMUP)
    if hit is None:
        return None
    evidence = [bundle.evidence(hit)]
    numbers: dict[str, float] = {}
    status = bundle.log.first(PROXIED) or bundle.log.first(WARMUP_STATUS)
    detail = ""
    if status is not None:
        numbers["http_status"] = int(status[1]["status"])
        evidence.append(bundle.evidence(status))
        detail = f" answered {status[1]['status']}"
    request = bundle.log.first(WARMUP_STATUS)
    proxy = ""
    if request is not None:
        numbers["port"] = int(request[1]["port"])
        line = bundle.log.lines[request[0] - 1]
        if re.search(r"http://[\d.]+:\d+ \"(?:GET|POST) http://", line):
            proxy = " through the HTTP proxy from the environment (no_proxy lacks its host)"
            evidence.append(bundle.evidence(request))
    port = f" on port {numbers['port']:g}" if "port" in numbers else ""
    return Diagnosis(
        category="health-check-failure",
        summary=(
            f"the warm-up request to the server{port} went{proxy or ' out'} and{detail}, so "
            "SGLang killed itself although the model loaded"
        ),
        remedy=(
            "set no_proxy/NO_PROXY=localhost,127.0.0.1,0.0.0.0 (or unset http_proxy for the "
            "server process), or serve on --host 127.0.0.1"
        ),
        evidence=evidence,
        numbers=numbers,
    )


LOAD_BARRIER = re.compile(
    r"(?:TP rank (?P<rank>\d+) )?could finish the model loading, but there are other ranks "
    r"that didn't finish loading"
)


@dataclass(frozen=True)
class BarrierTimeout:
    """Ranks that gave up at the post-load barrier (``hits``, its lines) of a TP-``tp`` launch:
    how many shards the checkpoint has (as the log writes it), how many ranks finished loading,
    the barrier's timeout in seconds (from a failing rank's ``Load weight end`` to its error)
    and the minutes a typical rank took to load, where the log says."""

    hits: tuple[Hit, ...]
    tp: int
    shards: str | None
    finished: int
    barrier_s: int | None
    load_minutes: float | None

    @property
    def suggested_s(self) -> int:
        """Three times the barrier's timeout, at least 1800 s (the default of the versions
        where it became configurable)."""
        return max(1800, 3 * (self.barrier_s or 0))


def _load_ends(bundle: Bundle) -> dict[int, datetime]:
    """When each TP rank logged ``Load weight end`` (by rank, the last line of each)."""
    ends: dict[int, datetime] = {}
    for number, _ in bundle.log.find(LOAD_END):
        line = bundle.log.lines[number - 1]
        when, ranks = _when(line), RANK_TAG.findall(_prefix(line))
        if when is not None and ranks:
            ends[int(ranks[0])] = when
    return ends


def _barrier_seconds(bundle: Bundle, hits: list[Hit], ends: dict[int, datetime]) -> int | None:
    """From the first failing rank with both times: its load end to its barrier error, s."""
    for number, match in hits:
        rank = match["rank"] or next(
            iter(RANK_TAG.findall(_prefix(bundle.log.lines[number - 1]))), None
        )
        start = ends.get(int(rank)) if rank is not None else None
        error = next(
            (t for t in map(_when, reversed(bundle.log.lines[:number])) if t is not None), None
        )
        if start is not None and error is not None:
            return int((error - start).total_seconds())
    return None


def _load_minutes(bundle: Bundle, ends: dict[int, datetime]) -> float | None:
    """Minutes from ``Load weight begin`` to the median rank's ``Load weight end``."""
    begin = bundle.log.first(LOAD_BEGIN)
    if begin is not None and ends and (started := _when(bundle.log.lines[begin[0] - 1])):
        typical = sorted(ends.values())[(len(ends) - 1) // 2]
        return (typical - started).total_seconds() / 60
    return None


def _barrier_timeout(bundle: Bundle) -> BarrierTimeout | None:
    hits = bundle.log.find(LOAD_BARRIER)
    if not hits:
        return None
    shards = bundle.log.find(SHARDS)
    ends = _load_ends(bundle)
    return BarrierTimeout(
        tuple(hits),
        bundle.tp(),
        shards[-1][1]["total"] if shards else None,
        len(ends) if ends else len(hits),
        _barrier_seconds(bundle, hits, ends),
        _load_minutes(bundle, ends),
    )


def startup_timeout(bundle: Bundle) -> Diagnosis | None:
    """Ranks that finished loading gave up waiting for the others at the post-load barrier
    (``other ranks that didn't finish loading``, §6). The barrier's timeout is the time from a
    failing rank's own ``Load weight end`` to its error."""
    found = _barrier_timeout(bundle)
    return None if found is None else _barrier_timeout_diagnosis(bundle, found)


def _barrier_timeout_diagnosis(bundle: Bundle, found: BarrierTimeout) -> Diagnosis:
    numbers: dict[str, float] = {"tp_size": found.tp}
    loaded = timeout = took = ""
    if found.shards is not None:
        numbers["shards"] = int(found.shards)
        loaded = f" after loading {found.shards} checkpoint shards"
    if found.barrier_s is not None:
        numbers["barrier_timeout_s"] = found.barrier_s
        timeout = f" after the {found.barrier_s:g} s barrier"
    if found.load_minutes is not None:
        numbers["normal_rank_load_min"] = round(found.load_minutes)
        took = f" (they loaded in about {round(found.load_minutes)} min)"
    return Diagnosis(
        category="startup-timeout",
        summary=(
            f"model-loading barrier timed out{loaded}: {found.finished} of {found.tp} TP ranks "
            f"finished loading{took} and gave up waiting for the others{timeout}; a slow rank or "
            "node, unless the lagging rank was OOM-killed"
        ),
        remedy=(
            "raise the barrier timeout (SGLANG_MODEL_LOADING_TIMEOUT_S="
            f"{found.suggested_s}), pre-stage weights on faster local storage, check the slow "
            "node, and check for an OOM on the lagging rank"
        ),
        evidence=[bundle.evidence(hit) for hit in found.hits[:3]],
        numbers=numbers,
    )


# tqdm's progress of the checkpoint, with its clock: "| 106/163 [09:36<05:20, 5.4s/it]".
SHARD_CLOCK = re.compile(
    r"checkpoint shards:\s*\d+% Completed \| (?P<done>\d+)/(?P<total>\d+) "
    r"\[(?P<elapsed>[\d:]+)<(?P<left>[\d:]+)"
)


def _seconds(clock: str) -> int:
    """tqdm's ``MM:SS`` or ``H:MM:SS`` → seconds."""
    total = 0
    for part in clock.split(":"):
        total = total * 60 + int(part)
    return total


def _loading_at(bundle: Bundle, line: int) -> tuple[dict[str, float], str]:
    """How far the checkpoint had loaded by log line ``line``: figures and words."""
    before = [m for n, m in bundle.log.find(SHARDS) if n <= line] or [
        m for _, m in bundle.log.find(SHARDS)
    ]
    if not before:
        return {}, ""
    last = before[-1]
    numbers: dict[str, float] = {
        "shards_loaded": int(last["done"]),
        "shards_total": int(last["total"]),
    }
    said = f"{last['done']}/{last['total']} checkpoint shards loaded"
    clock = SHARD_CLOCK.search(last.string)
    if clock is not None:
        numbers.update(
            load_elapsed_s=_seconds(clock["elapsed"]), load_remaining_s=_seconds(clock["left"])
        )
        said += (
            f" after {numbers['load_elapsed_s']:g} s, about {numbers['load_remaining_s']:g} s "
            "still to go"
        )
    return numbers, said


# vLLM V1's API server waits VLLM_ENGINE_READY_TIMEOUT_S (600 s by default) for the engine
# cores' first message (v1/engine/core_client.py, v1/utils.py).
ENGINE_READY_TIMEOUT = re.compile(
    r"Timed out waiting for engines? (?:core processes )?to (?:send initial message|start)"
)
VLLM_ENGINE_READY_DEFAULT_S = 600


def engine_ready_timeout(bundle: Bundle) -> Diagnosis | None:
    """vLLM's API server stopped waiting for its engine cores while they were still starting
    (usually still loading the weights)."""
    hit = bundle.log.first(ENGINE_READY_TIMEOUT)
    if hit is None:
        return None
    env = bundle.facts.get("env") or {}
    limit = str(env.get("VLLM_ENGINE_READY_TIMEOUT_S") or "")
    seconds = int(limit) if limit.isdigit() else VLLM_ENGINE_READY_DEFAULT_S
    numbers, loading = _loading_at(bundle, hit[0])
    numbers["engine_ready_timeout_s"] = seconds
    return Diagnosis(
        category="startup-timeout",
        summary=(
            f"vLLM's API server gave up after VLLM_ENGINE_READY_TIMEOUT_S = {seconds} s waiting "
            "for the engine cores, which were still starting"
            + (f" ({loading})" if loading else "")
            + "; the exit that follows is that timeout, not a crash"
        ),
        remedy=(
            f"raise the engine ready timeout (VLLM_ENGINE_READY_TIMEOUT_S above {seconds}, to "
            "cover the load), pre-stage weights on local NVMe / warm the page cache, or retry "
            "once cached"
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


# sglang-router (Rust) waits --router-worker-startup-timeout-secs for every worker's /health.
ROUTER_TIMEOUT = re.compile(r"Timeout (?P<s>\d+)s waiting for workers to become healthy")
ROUTER_WORKER = re.compile(r"Worker https?://[^:/\s]+:(?P<port>\d+)")


def router_timeout(bundle: Bundle) -> Diagnosis | None:
    """The router stopped waiting for its workers to answer /health while they were still
    starting (loading, compiling, capturing)."""
    hit = bundle.log.first(ROUTER_TIMEOUT)
    if hit is None:
        return None
    seconds = int(hit[1]["s"])
    numbers: dict[str, float] = {"router_worker_startup_timeout_s": seconds}
    worker = bundle.log.first(ROUTER_WORKER)
    said = ""
    if worker is not None:
        numbers["worker_port"] = int(worker[1]["port"])
        said = f" (worker on port {worker[1]['port']}"
        dp = bundle.count("dp_size")
        numbers["dp_size"] = dp
        said += f", dp {dp})"
    return Diagnosis(
        category="startup-timeout",
        summary=(
            f"the router gave up after {seconds} s waiting for its workers to become healthy"
            f"{said}; the worker was still starting, not failing"
        ),
        remedy=(
            f"raise --router-worker-startup-timeout-secs above {seconds} (sglang-router >= "
            "0.1.3), or launch the server first and the router after it is healthy; start-up "
            "is shorter without --enable-torch-compile"
        ),
        evidence=[bundle.evidence(hit)] + ([bundle.evidence(worker)] if worker else []),
        numbers=numbers,
    )


# Something outside the server stopped it for taking too long: a liveness or start-up probe,
# the panel's start-up timeout. Read from what the notes assert (plain_words drops negations).
OUTSIDE_LIMIT = re.compile(
    r"(?i)(?P<probe>liveness|startup|start-up) probe failed|failed (?:its )?(?P<probe2>liveness|"
    r"startup) probe|start-up timeout|startup timeout|no successful GET /health within "
    r"(?P<within>\d+) s"
)
INITIAL_DELAY = re.compile(
    r"(?i)(?P<probe>liveness|startup)Probe\b[^;]*?initialDelaySeconds (?P<s>\d+)"
)
LIMIT_SECONDS = re.compile(r"(?i)start-up timeout[^.;]*? is (?P<s>\d+) s")
GRACE = re.compile(r"terminationGracePeriodSeconds (?P<s>\d+)")
KILLED = {-9, 137, -15, 143}


def killed_while_starting(bundle: Bundle) -> Diagnosis | None:
    """The server was killed (SIGKILL/SIGTERM, exit 137/143) before it was ready, by a time
    limit the notes name (a liveness probe, the panel's start-up timeout), with no error of its
    own in the log: it was still starting (loading, allocating), not failing."""
    code = (bundle.facts.get("exit") or {}).get("code")
    limit = bundle.note_match(OUTSIDE_LIMIT)
    if limit is None or code not in KILLED:
        return None
    if bundle.log.first(ERROR_LINE) is not None:
        return None
    numbers: dict[str, float] = {"exit_code": code}
    said = ["killed while still starting"]
    delay = bundle.note_match(INITIAL_DELAY)
    by = "a time limit"
    if limit["probe"] or limit["probe2"] or delay is not None:
        probe = limit["probe"] or limit["probe2"] or delay["probe"] if delay else "liveness"
        by = f"the {str(probe).lower()} probe"
        if delay is not None:
            numbers["liveness_initial_delay_s"] = int(delay["s"])
            by += f" (initialDelaySeconds {delay['s']}, no startupProbe)"
    within = limit["within"] or (m["s"] if (m := bundle.note_match(LIMIT_SECONDS)) else None)
    if within:
        numbers["startup_timeout_s"] = int(within)
        by = f"the start-up timeout of {within} s"
    said.append(f"by {by}")
    loads, loading = _loading_at(bundle, len(bundle.log.lines))
    numbers.update(loads)
    if loading:
        said.append(f"at {loading}")
    grace = bundle.note_match(GRACE)
    if grace is not None:
        numbers["termination_grace_s"] = int(grace["s"])
        said.append(f"SIGKILL after the {grace['s']} s grace period")
    said.append(f"exit code {code}; no error of its own and no OOM kill")
    return Diagnosis(
        category="startup-timeout",
        summary=", ".join(said),
        remedy=(
            "give start-up the time loading takes: a startupProbe (failureThreshold 60 x "
            "periodSeconds 10) or raise initialDelaySeconds / the panel's start-up timeout; "
            "faster model storage / local cache shortens it"
        ),
        evidence=[Evidence(limit.string, None, "snapshot")],
        numbers=numbers,
    )


ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|\bError: |Exception: ")


#: The line that alone shows each rule's failure, whatever its figures say (engine._unreadable).
RECOGNISES: dict[Rule, tuple[str, re.Pattern[str]]] = {
    engine_ready_timeout: ("startup-timeout", ENGINE_READY_TIMEOUT),
    router_timeout: ("startup-timeout", re.compile(r"waiting for workers to become healthy")),
}
