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
    Bundle,
    Diagnosis,
    Hit,
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


SHARDS = re.compile(r"checkpoint shards:\s*\d+% Completed \| (?P<done>\d+)/(?P<total>\d+)")


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
