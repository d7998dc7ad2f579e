"""What the panel shows of a running server: its effective settings from ``/get_server_info``
(``/server_info`` 0.5.9+) and the load gauges from ``/metrics`` (with ``--enable-metrics``).

Sources: shared/reference/sglang.md §5 (``http_server.py``; gauges of ``metrics/collector.py``
@0.5.2 and ``observability/metrics_collector.py`` @0.5.23, one sample per scheduler rank).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

#: Settings kept from the server's answer (the rest of the flat JSON is every server arg).
KEPT = (
    "version",
    "model_path",
    "tp_size",
    "pp_size",
    "dp_size",
    "port",
    "mem_fraction_static",
    "max_total_num_tokens",
    "max_req_input_len",
    "context_length",
    "enable_hierarchical_cache",
    "hicache_size",
    "hicache_ratio",
    "kv_cache_dtype",
    "page_size",
    "chunked_prefill_size",
    "max_running_requests",
    "enable_metrics",
)

#: The gauges ``summarise_metrics`` reads, without their ``sglang:`` prefix.
WANTED = (
    "token_usage",
    "num_running_reqs",
    "num_queue_reqs",
    "gen_throughput",
    "cache_hit_rate",
    "num_retracted_reqs",
)


class ServerInfoError(ValueError):
    """The answer is not the JSON object SGLang sends."""


def effective_settings(body: bytes) -> dict[str, Any]:
    """The kept settings from a ``/get_server_info`` body, plus ``memory_usage`` (GB, as the
    server reports it) from its first ``internal_states`` entry. Raises ``ServerInfoError``."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise ServerInfoError("the server info is not JSON") from None
    if not isinstance(doc, dict):
        raise ServerInfoError("the server info is not a JSON object")
    kept = {key: doc[key] for key in KEPT if key in doc}
    states = doc.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        usage = states[0].get("memory_usage")
        if isinstance(usage, dict):
            kept["memory_usage"] = usage
        if "max_total_num_tokens" not in kept and "max_total_num_tokens" in states[0]:
            kept["max_total_num_tokens"] = states[0]["max_total_num_tokens"]
    return kept


#: The largest figure taken from a server (beyond it a reading is nonsense, not a count).
MAX_FIGURE = 1e15

#: Cumulative figures read with the gauges, for what they give over an interval
#: (``load_sample``): time to first token (the histogram's sum and count, s) and, per finished
#: request, prompt and generated tokens (shared/reference/sglang.md §5).
COUNTERS = (
    "time_to_first_token_seconds_sum",
    "time_to_first_token_seconds_count",
    "prompt_tokens_total",
    "generation_tokens_total",
    "num_requests_total",
)


def load_sample(
    previous: dict[str, Any] | None, figures: dict[str, float], t: float
) -> dict[str, Any]:
    """One stored load sample at ``t`` s: the gauges and counters of ``figures``
    (``summarise_metrics``), and over the interval since ``previous`` (the last stored sample)
    ``ttft_s`` (mean time to first token of the requests that got one, s) and
    ``request_tokens`` (mean prompt + generated tokens of the requests that finished). A
    counter that went back (the server restarted) gives no interval figure."""
    sample: dict[str, Any] = {"t": round(t, 1), **figures}
    if not previous:
        return sample

    def delta(name: str) -> float | None:
        now, then = figures.get(name), previous.get(name)
        if not isinstance(now, int | float) or not isinstance(then, int | float) or now < then:
            return None
        return float(now - then)

    firsts, waited = (
        delta("time_to_first_token_seconds_count"),
        delta("time_to_first_token_seconds_sum"),
    )
    if firsts and waited is not None:
        sample["ttft_s"] = round(waited / firsts, 3)
    done = delta("num_requests_total")
    prompt, generated = delta("prompt_tokens_total"), delta("generation_tokens_total")
    if done and prompt is not None and generated is not None:
        sample["request_tokens"] = round((prompt + generated) / done)
    return sample


def summarise_metrics(text: str) -> dict[str, float]:
    """Load figures from Prometheus text: ``token_usage`` (highest rank, fraction of the KV pool),
    ``num_running_reqs`` and ``num_queue_reqs`` (rank 0: every TP rank sees the same batch),
    ``gen_throughput`` (tokens/s, rank 0), ``cache_hit_rate`` (prefix hits, 0–1) and
    ``num_retracted_reqs`` (rank 0), and the ``COUNTERS``, where the server exports them.
    Samples are read by ``prometheus_client``'s parser; text it cannot read gives fewer
    figures (``{}`` for none), never an exception."""
    found: dict[str, list[tuple[str, float]]] = {}
    for sample in _samples(text):
        name = sample.name.removeprefix("sglang:")
        if name == sample.name or (name not in WANTED and name not in COUNTERS):
            continue
        value = float(sample.value)
        if not math.isfinite(value) or value < 0 or value > MAX_FIGURE:
            continue  # no gauge or counter of SGLang's is negative, infinite or NaN
        rank = sample.labels.get("tp_rank", "")
        found.setdefault(name, []).append((rank if rank.isdigit() else "0", value))
    summary: dict[str, float] = {}
    for name, samples in found.items():
        if name == "token_usage":
            summary[name] = max(v for _, v in samples)
        else:
            first = [v for r, v in samples if r == "0"] or [samples[0][1]]
            summary[name] = first[0]
    return summary


#: What prometheus_client's text parser raises on a malformed line: ``ValueError`` mostly, and
#: ``IndexError`` where a label set ends early (0.26.0: ``x{, =00} 1``; found by Hypothesis).
PARSE_ERRORS = (ValueError, IndexError, KeyError, TypeError)


def _samples(text: str) -> Iterator[Sample]:
    """Every sample of the exposition. The parser gives up on the whole text at its first
    malformed line (``PARSE_ERRORS``), so such a text is read again line by line, and only the
    lines it cannot read are left out."""
    try:
        families = list(text_string_to_metric_families(text))
    except PARSE_ERRORS:
        for line in text.splitlines():
            try:
                families = list(text_string_to_metric_families(line))
            except PARSE_ERRORS:
                continue
            yield from (sample for family in families for sample in family.samples)
        return
    yield from (sample for family in families for sample in family.samples)
