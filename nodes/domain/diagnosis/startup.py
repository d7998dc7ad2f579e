"""Rules for a server that loaded but never became ready: its warm-up request failed, or ranks
gave up waiting for the others at the post-load barrier."""

from __future__ import annotations

import re
from datetime import datetime

from nodes.domain.diagnosis.evidence import (
    LOAD_BEGIN,
    LOAD_END,
    RANK_TAG,
    Bundle,
    Diagnosis,
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


def startup_timeout(bundle: Bundle) -> Diagnosis | None:
    """Ranks that finished loading gave up waiting for the others at the post-load barrier
    (``other ranks that didn't finish loading``, §6). The barrier's timeout is the time from a
    failing rank's own ``Load weight end`` to its error."""
    hits = bundle.log.find(LOAD_BARRIER)
    if not hits:
        return None
    tp = bundle.tp()
    numbers: dict[str, float] = {"tp_size": tp}
    shards = bundle.log.find(SHARDS)
    loaded = ""
    if shards:
        numbers["shards"] = int(shards[-1][1]["total"])
        loaded = f" after loading {shards[-1][1]['total']} checkpoint shards"
    ends: dict[int, datetime] = {}
    for number, _ in bundle.log.find(LOAD_END):
        line = bundle.log.lines[number - 1]
        when, ranks = _when(line), RANK_TAG.findall(_prefix(line))
        if when is not None and ranks:
            ends[int(ranks[0])] = when
    finished = f"{len(ends)} of {tp} TP ranks" if ends else f"{len(hits)} of {tp} TP ranks"
    timeout = ""
    for number, match in hits:
        rank = match["rank"] or next(
            iter(RANK_TAG.findall(_prefix(bundle.log.lines[number - 1]))), None
        )
        start = ends.get(int(rank)) if rank is not None else None
        error = next(
            (t for t in map(_when, reversed(bundle.log.lines[:number])) if t is not None), None
        )
        if start is not None and error is not None:
            numbers["barrier_timeout_s"] = int((error - start).total_seconds())
            timeout = f" after the {numbers['barrier_timeout_s']:g} s barrier"
            break
    begin = bundle.log.first(LOAD_BEGIN)
    took = ""
    if begin is not None and ends and (started := _when(bundle.log.lines[begin[0] - 1])):
        typical = sorted(ends.values())[(len(ends) - 1) // 2]
        minutes = (typical - started).total_seconds() / 60
        numbers["normal_rank_load_min"] = round(minutes)
        took = f" (they loaded in about {round(minutes)} min)"
    # 1800 s is the default of the versions where the barrier's timeout became configurable.
    suggested = max(1800, 3 * int(numbers.get("barrier_timeout_s", 0)))
    return Diagnosis(
        category="startup-timeout",
        summary=(
            f"model-loading barrier timed out{loaded}: {finished} finished loading{took} and "
            f"gave up waiting for the others{timeout}; a slow rank or node, unless the lagging "
            "rank was OOM-killed"
        ),
        remedy=(
            f"raise the barrier timeout (SGLANG_MODEL_LOADING_TIMEOUT_S={suggested}), pre-stage "
            "weights on faster local storage, check the slow node, and check for an OOM on the "
            "lagging rank"
        ),
        evidence=[bundle.evidence(hit) for hit in hits[:3]],
        numbers=numbers,
    )
