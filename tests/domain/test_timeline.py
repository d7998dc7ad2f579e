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


def test_hours_of_load_keep_its_last_hour_at_the_followers_pace_and_thins_the_rest():
    series: list[dict] = []
    for second in range(0, 3 * 3600, 2):  # a sample every 2 s for three hours
        series = timeline.append_load(series, {"t": float(second), "num_running_reqs": 1})
    times = [s["t"] for s in series]
    recent = [t for t in times if t >= times[-1] - timeline.RECENT_S]
    # The last hour: one sample per 5 s at most, none missing for longer than that.
    assert len(recent) >= timeline.RECENT_SAMPLES - 1
    assert max(b - a for a, b in zip(recent, recent[1:], strict=False)) <= 6
    older = times[: len(times) - len(recent)]
    assert older[0] == 0.0 and len(older) <= timeline.MAX_SAMPLES + 1
    assert times == sorted(times)


def test_the_last_hour_is_drawn_from_its_start_and_the_whole_life_from_zero():
    series = [{"t": float(t), "num_running_reqs": t % 7} for t in range(0, 7200, 10)]
    hour = timeline.load_charts(series, since=3600.0)[0]
    life = timeline.load_charts(series)[0]
    assert [t.label for t in hour.x_ticks] == ["3,600 s", "5,395 s", "7,190 s"]
    assert life.x_ticks[0].label == "0 s"
    first_x = float(hour.series[0].points.split()[0].split(",")[0])
    assert first_x == 0.0 and len(hour.series[0].points.split()) == 360
