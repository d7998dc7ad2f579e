"""What bounds a running server, from its gauges: the seed incident's first chapter and the
other patterns, each named only once it has held for 30 s."""

from __future__ import annotations

import pytest

from nodes.domain.capacity import (
    HOLD_S,
    Capacity,
    Checked,
    Sample,
    Server,
    bottleneck,
    expected_running,
    options,
)

#: The incident's server: Kimi-K2.5 at TP 8, --mem-fraction-static 0.85, a device pool of
#: 116,171 tokens; 150 clients of ~4,000-token requests; 46–56 ran, 94–101 waited, usage
#: 0.85–0.96 (the operator's metrics).
INCIDENT = Server(pool_tokens=116_171, max_running_requests=None)


def _series(seconds: float, every: float = 5.0, **gauges: float) -> list[Sample]:
    return [Sample(t=i * every, **gauges) for i in range(int(seconds / every) + 1)]


def test_the_incidents_server_is_bound_by_its_device_kv_pool_with_the_numbers():
    samples = [
        Sample(t=i * 5.0, token_usage=0.85 + 0.01 * (i % 12), running=46 + i % 11,
               queued=101 - i % 8, gen_throughput=500.0, request_tokens=4_150.0)
        for i in range(13)
    ]  # fmt: skip
    found = bottleneck(samples, INCIDENT)
    assert found.bottleneck == "kv-bound" and found.held_s >= HOLD_S
    figures = found.figures
    assert figures["pool_tokens"] == 116_171
    assert 46 <= figures["running"] <= 56 and 94 <= figures["queued"] <= 101
    # Each running request holds about 2,100 tokens of the pool now; ~4,000 once generated.
    assert 1_800 <= figures["avg_tokens_per_request"] <= 2_400
    assert figures["requests_that_fit"] == 116_171 // figures["avg_tokens_per_request"]
    # Whole requests of ~4,150 tokens (input + output): about 28 fit the pool at once.
    assert figures["whole_requests_that_fit"] == 27


def test_a_pattern_is_named_only_once_it_has_held_for_30_s():
    short = _series(HOLD_S - 10, token_usage=0.95, running=40, queued=90)
    assert bottleneck(short, INCIDENT).bottleneck == "unknown"
    # Full for the last 15 s only, after a quiet stretch: not yet KV-bound, and not "none"
    # either (requests wait): it says what builds.
    quiet = _series(60, token_usage=0.3, running=10, queued=0)
    full = [Sample(t=65 + i * 5, token_usage=0.95, running=40, queued=90) for i in range(4)]
    building = bottleneck(quiet + full, INCIDENT)
    assert building.bottleneck == "unknown" and building.held_s == 15
    assert building.why == (
        "requests have waited at a full device KV pool for 15 s; it is named kv-bound once "
        "that holds 30 s"
    )
    assert bottleneck(quiet + full + [
        Sample(t=85 + i * 5, token_usage=0.95, running=40, queued=90) for i in range(3)
    ], INCIDENT).bottleneck == "kv-bound"  # fmt: skip


@pytest.mark.parametrize(
    ("server", "gauges", "expected"),
    [
        # The pool has room and the batch is at the running limit: the GPUs bound it.
        (Server(200_000, 64), {"token_usage": 0.3, "running": 60, "queued": 20}, "compute-bound"),
        # Full pool but the running limit reached: not the pool's doing.
        (Server(200_000, 64), {"token_usage": 0.95, "running": 64, "queued": 20}, "none"),
        # Long time to the first token with hardly a queue: prefill.
        (Server(200_000), {"token_usage": 0.4, "running": 8, "queued": 1, "ttft_s": 6.0},
         "prefill-bound"),
        # HiCache on, prefixes not shared: the host pool does not pay.
        (Server(200_000, hicache=True), {"token_usage": 0.4, "running": 8, "queued": 0,
                                         "cache_hit_rate": 0.02}, "host-pool"),
        (Server(200_000), {"token_usage": 0.2, "running": 3, "queued": 0}, "none"),
    ],
)  # fmt: skip
def test_each_pattern_is_named(server, gauges, expected):
    assert bottleneck(_series(45, **gauges), server).bottleneck == expected


def test_a_load_that_fills_the_pool_is_never_called_host_pool_before_or_after():
    """Found by a newcomer: with HiCache on and no shared prefixes, the first ~40 s of a load
    that queued at 100 % KV were named ``host-pool``, and so was the verdict after the load."""
    server = Server(200_000, hicache=True)
    idle = _series(60, token_usage=0.0, running=0, queued=0, cache_hit_rate=0.0)
    assert bottleneck(idle, server).bottleneck == "none"  # nothing runs: no hits to find
    load = [
        Sample(t=65 + i * 5, token_usage=1.0, running=30, queued=70, cache_hit_rate=0.0)
        for i in range(12)
    ]
    for end in range(1, len(load) + 1):
        found = bottleneck(idle + load[:end], server).bottleneck
        assert found in ("unknown", "kv-bound"), (end, found)
    assert bottleneck(idle + load, server).bottleneck == "kv-bound"
    after = [
        Sample(t=130 + i * 5, token_usage=0.0, running=0, queued=0, cache_hit_rate=0.0)
        for i in range(20)
    ]
    # Still running, idle now: nothing bounds it. Stopped: the verdict of its loaded period.
    assert bottleneck(idle + load + after, server).bottleneck == "none"
    kept = bottleneck(idle + load + after, server, ended=True)
    assert kept.bottleneck == "kv-bound" and kept.figures["queued"] == 70


def test_retractions_that_keep_coming_are_preemption():
    samples = [
        Sample(t=i * 5.0, token_usage=0.7, running=30, queued=0, retracted=float(3 * i))
        for i in range(10)
    ]
    found = bottleneck(samples, Server(150_000))
    assert found.bottleneck == "preemption" and found.held_s >= HOLD_S


def test_without_gauges_it_is_unknown_not_a_guess():
    assert bottleneck([Sample(t=0), Sample(t=60)], INCIDENT).bottleneck == "unknown"
    assert Sample.of({"t": 3, "token_usage": float("nan"), "num_running_reqs": True}) == Sample(
        t=3.0
    )


def test_a_larger_pool_runs_what_it_fits_no_more_than_waits_nor_the_limit():
    capacity = Capacity(
        "kv-bound", 60, {"running": 50, "queued": 100, "avg_tokens_per_request": 2_000}
    )
    assert expected_running(capacity, 150_000, Server(116_171)) == (75, 1.5)
    assert expected_running(capacity, 10**7, Server(116_171)) == (150, 3.0)  # all that waits
    assert expected_running(capacity, 10**7, Server(116_171, 64)) == (64, 1.28)
    assert expected_running(Capacity("unknown"), 150_000, Server(116_171)) is None


def _fake_budget(change: dict) -> Checked:
    """A node where each 0.01 of mem-fraction adds 3,000 device tokens from 0.85 (100,000),
    headroom runs low past 0.90 (warn), graphs no longer fit past 0.93 (block); fp8 doubles."""
    mfs = change.get("--mem-fraction-static", 0.85)
    pool = round(100_000 + (mfs - 0.85) * 300_000)
    if change.get("--kv-cache-dtype") == "fp8_e5m2":
        pool *= 2
    if mfs > 0.93:
        return Checked("block", pool)
    if mfs > 0.90:
        return Checked("warn", pool, ("only 4 GiB left for activations and CUDA graphs",))
    return Checked("ok", pool)


def test_the_options_for_a_kv_bound_server_are_checked_and_scaled_by_the_measured_pool():
    capacity = Capacity(
        "kv-bound", 60,
        {"running": 50, "queued": 100, "avg_tokens_per_request": 2_000, "pool_tokens": 116_171},
    )  # fmt: skip
    offered = options(capacity, INCIDENT, mfs=0.85, kv_dtype="auto", recheck=_fake_budget)
    (fraction, fp8) = offered
    # The highest fraction the check passes without a warning: 0.90, 115,000 / 100,000 of
    # the measured pool, ~133,600 tokens, ~66 requests of 2,000 tokens.
    assert fraction.change == {"--mem-fraction-static": 0.9} and fraction.verdict == "ok"
    assert fraction.expected_running_requests == 66
    assert fraction.expected_throughput_change == 1.32
    assert fp8.change == {"--kv-cache-dtype": "fp8_e5m2"}
    assert fp8.expected_running_requests == 116 and "accuracy" in fp8.why
    assert all(o.verdict != "block" for o in offered)


def test_only_a_kv_bound_server_is_offered_a_larger_pool():
    capacity = Capacity("compute-bound", 60, {"running": 60, "avg_tokens_per_request": 500})
    assert options(capacity, INCIDENT, mfs=0.85, kv_dtype="auto", recheck=_fake_budget) == []


def test_when_every_fraction_is_blocked_none_is_offered():
    capacity = Capacity(
        "kv-bound", 60, {"running": 50, "queued": 100, "avg_tokens_per_request": 2_000}
    )

    def blocked(change: dict) -> Checked:
        return Checked("ok" if not change else "block", 100_000)

    assert options(capacity, INCIDENT, mfs=0.85, kv_dtype="fp8_e5m2", recheck=blocked) == []


def test_a_server_on_half_a_node_is_offered_replicas_on_the_other_half():
    capacity = Capacity(
        "kv-bound", 60,
        {"running": 50, "queued": 100, "avg_tokens_per_request": 2_000, "pool_tokens": 116_171},
    )  # fmt: skip
    half = Server(pool_tokens=116_171, gpus=4)
    offered = options(capacity, half, mfs=0.85, kv_dtype="auto", recheck=_fake_budget, node_gpus=8)
    [replicas] = [o for o in offered if "--dp-size" in o.change]
    # Two replicas, each with the pool it has now: twice the tokens, all 150 that want to run.
    assert replicas.change == {"--dp-size": 2} and replicas.expected_running_requests == 116
    assert "8 GPUs" in replicas.why
    whole = options(capacity, Server(116_171, gpus=8), mfs=0.85, kv_dtype="auto",
                    recheck=_fake_budget, node_gpus=8)  # fmt: skip
    assert not any("--dp-size" in o.change for o in whole)  # no GPUs left for a second one


def test_a_retracting_server_is_offered_a_cap_at_the_requests_its_pool_holds_whole():
    capacity = Capacity(
        "preemption", 60,
        {"running": 40, "queued": 0, "pool_tokens": 100_000, "tokens_per_whole_request": 4_000,
         "whole_requests_that_fit": 25},
    )  # fmt: skip
    [cap] = options(capacity, Server(100_000), mfs=0.85, kv_dtype="auto", recheck=_fake_budget)
    assert cap.change == {"--max-running-requests": 25} and cap.expected_running_requests == 25
    assert "retracted" in cap.why and cap.verdict == "ok"
    # Already capped there: nothing to offer.
    capped = Server(100_000, max_running_requests=25)
    assert options(capacity, capped, mfs=0.85, kv_dtype="auto", recheck=_fake_budget) == []


def test_figures_no_server_gives_read_as_unknown():
    doc = {"t": 5, "num_running_reqs": -3, "token_usage": 1e308, "request_tokens": float("inf")}
    assert Sample.of(doc) == Sample(t=5.0)


def test_a_kv_bound_server_with_hicache_is_offered_removing_it_for_a_larger_pool():
    """The host pool forced the fraction down (0.5.9: it must outgrow the device pool); the
    advisor offers removing HiCache with the fraction the budget then passes, and says what it
    gives and what it costs (found by a newcomer: nothing offered turning HiCache off)."""

    def with_hicache_rule(change: dict) -> Checked:
        dropped = (
            "--enable-hierarchical-cache" in change
            and change["--enable-hierarchical-cache"] is None
        )
        if not dropped and change.get("--mem-fraction-static", 0.76) > 0.76:
            return Checked("block", None)  # the host pool no longer outgrows the device pool
        return _fake_budget({"--mem-fraction-static": 0.76, **change})

    server = Server(pool_tokens=90_000, hicache=True)
    capacity = Capacity(
        "kv-bound", 60,
        {"running": 40, "queued": 100, "avg_tokens_per_request": 2_000, "pool_tokens": 90_000,
         "cache_hit_rate": 0.02},
    )  # fmt: skip
    offered = options(capacity, server, mfs=0.76, kv_dtype="fp8_e5m2", recheck=with_hicache_rule)
    (drop,) = [o for o in offered if "--enable-hierarchical-cache" in o.change]
    assert drop.change == {
        "--enable-hierarchical-cache": None, "--hicache-size": None, "--mem-fraction-static": 0.9
    }  # fmt: skip
    assert drop.verdict == "ok" and drop.expected_running_requests > 40
    assert drop.why.startswith(
        "remove HiCache (a prefix hit rate of 2%: the host pool keeps prefixes only) and raise "
        "--mem-fraction-static from 0.76 to 0.9: about "
    )
    assert "requests run at once instead of 40" in drop.why
    # Without HiCache there is nothing to remove.
    plain = options(capacity, Server(90_000), mfs=0.76, kv_dtype="fp8_e5m2", recheck=_fake_budget)
    assert not [o for o in plain if "--enable-hierarchical-cache" in o.change]
