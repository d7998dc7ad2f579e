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


def test_gpus_that_drew_the_same_line_are_one_line_named_by_their_range():
    same = {i: 10 * GiB for i in range(8)}
    samples = [
        timeline.sample(0, GB, GB, dict.fromkeys(range(8), 0)),
        timeline.sample(5, GB, GB, same),
    ]
    (_, gpus) = timeline.charts(samples, dict.fromkeys(range(8), 96 * GiB))
    assert [(s.label, s.count) for s in gpus.series] == [("GPU 0–7 (the same on each)", 8)]
    one_differs = {**same, 3: 20 * GiB}
    samples[-1] = timeline.sample(5, GB, GB, one_differs)
    (_, gpus) = timeline.charts(samples, dict.fromkeys(range(8), 96 * GiB))
    assert [s.label for s in gpus.series] == ["GPU 0, 1, 2, 4, 5, 6, 7 (the same on each)", "GPU 3"]


def test_both_axes_are_labelled_from_zero_to_their_end():
    samples = [
        timeline.sample(0, 449 * GB, 449 * GB, {}),
        timeline.sample(120, 449 * GB, 9 * GB, {}),
    ]
    (host,) = timeline.charts(samples, {})
    assert [(t.label, t.percent) for t in host.y_ticks] == [
        ("0 GB", 0),
        ("224.5 GB", 50),
        ("449 GB", 100),
    ]
    assert [t.label for t in host.x_ticks] == ["0 s", "60 s", "120 s"]


def test_a_kill_the_sampler_missed_is_marked_with_what_the_kernel_said():
    line = (
        "Out of memory: Killed process 4242 (sglang::schedul) total-vm:461943040kB, "
        "anon-rss:300000000kB, file-rss:0kB, shmem-rss:20000000kB, UID:0 pgtables:1kB"
    )
    (kill,) = timeline.kill_events(["noise", line], 310.0)
    assert kill.chart == "host" and kill.kind == "kill" and kill.t == 310.0
    assert "PID 4242 (sglang::schedul) holding 327.7 GB" in kill.label
    samples = [
        timeline.sample(0, 449 * GB, 440 * GB, {}),
        timeline.sample(300, 449 * GB, 145 * GB, {}),
    ]
    (host,) = timeline.charts(samples, {}, [kill])
    assert host.duration_s == 310.0  # the axis reaches the kill
    (marker,) = host.markers
    assert marker.x == 600.0 and "host RAM was exhausted" in marker.label


def test_several_kills_are_one_marker_that_says_they_came_one_after_another():
    def line(pid: int, kb: int) -> str:
        return (
            f"Out of memory: Killed process {pid} (sglang::schedul) total-vm:1kB, "
            f"anon-rss:{kb}kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB"
        )

    (kill,) = timeline.kill_events([line(41, 100_000_000), line(42, 104_000_000)], 300.0)
    assert "2 processes, one after another (PIDs 41, 42)" in kill.label
    assert "the largest held 106.5 GB when it was killed" in kill.label


def test_the_load_over_a_launchs_life_is_drawn_from_its_series():
    series = [
        {"t": 0.0, "token_usage": 0.2, "num_running_reqs": 5, "num_queue_reqs": 0,
         "gen_throughput": 100.0},
        {"t": 60.0, "token_usage": 0.95, "num_running_reqs": 50, "num_queue_reqs": 98,
         "gen_throughput": 500.0},
    ]  # fmt: skip
    usage, requests, throughput = timeline.load_charts(series)  # no hit rate: no chart
    assert usage.title == "KV token usage" and usage.series[0].points == "0.0,128.0 600.0,8.0"
    assert usage.series[0].peak_text == "device KV pool in use: peak 95 %"
    assert [t.label for t in usage.y_ticks] == ["0 %", "50 %", "100 %"]
    assert [s.label for s in requests.series] == ["running", "waiting"]
    assert requests.y_ticks[-1].label == "98"  # the axis tops at the highest figure
    assert throughput.series[0].peak_text == "tokens/s: peak 500 tokens/s"
    assert timeline.load_charts(series[:1]) == []
