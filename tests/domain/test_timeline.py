"""The memory timeline: bounded samples and the chart's scaling."""

from __future__ import annotations

from nodes.domain import timeline

GB, GiB = 10**9, 2**30


def test_a_long_start_up_keeps_the_first_and_latest_samples_at_even_resolution():
    samples: list[dict] = []
    for t in range(2000):
        samples = timeline.append(samples, timeline.sample(t, 100 * GB, 50 * GB, {0: t}))
    assert len(samples) <= timeline.MAX_SAMPLES
    assert samples[0]["t"] == 0 and samples[-1]["t"] == 1999
    gaps = [b["t"] - a["t"] for a, b in zip(samples, samples[1:], strict=False)]
    assert max(gaps) <= 6 * 1999 / timeline.MAX_SAMPLES


def test_charts_scale_used_memory_to_capacity_over_time():
    samples = [
        timeline.sample(0, 400 * GB, 400 * GB, {0: 0, 1: 0}),
        timeline.sample(10, 400 * GB, 200 * GB, {0: 48 * GiB, 1: 96 * GiB}),
    ]
    host, gpus = timeline.charts(samples, {0: 96 * GiB, 1: 96 * GiB})
    assert host.title == "Host RAM used" and host.unit == "GB"
    assert host.series[0].points == "0.0,160.0 600.0,80.0"
    assert host.series[0].peak_bytes == 200 * GB
    assert [s.label for s in gpus.series] == ["GPU 0", "GPU 1"] and gpus.unit == "GiB"
    assert gpus.series[1].points.endswith("600.0,0.0")


def test_one_sample_draws_nothing():
    assert timeline.charts([timeline.sample(0, GB, GB, {})], {}) == []
    assert timeline.lowest_available([]) is None
