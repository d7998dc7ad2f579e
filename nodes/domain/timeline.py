"""A launch's memory over time: samples of host RAM and each GPU's used memory taken during
start-up, kept to a bounded number, and drawn as SVG polylines for the launch page.

A sample is ``{"t": seconds since the launch began, "host_total_bytes", "host_available_bytes",
"gpus": {"<index>": used bytes}}``; host RAM *used* is total − MemAvailable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nodes.domain.units import format_bytes

#: At most this many samples are kept, spread evenly over the launch: the first and the latest
#: always stay.
MAX_SAMPLES = 600
WIDTH, HEIGHT = 600, 160  # the SVG's own coordinates; the page scales it to its width


def sample(
    t: float, host_total: int | None, host_available: int | None, gpus: Mapping[int, int]
) -> dict[str, Any]:
    return {
        "t": round(t, 1),
        "host_total_bytes": host_total,
        "host_available_bytes": host_available,
        "gpus": {str(i): int(b) for i, b in sorted(gpus.items())},
    }


def append(samples: Sequence[Mapping[str, Any]], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``samples`` with ``new`` last. Samples closer together than half of an even spread of
    the whole span over ``MAX_SAMPLES`` replace the latest one instead of adding to it."""
    out = [dict(s) for s in samples]
    if len(out) >= 2:
        span = float(new.get("t") or 0) - float(out[0].get("t") or 0)
        spacing = 2 * span / MAX_SAMPLES
        if float(new.get("t") or 0) - float(out[-2].get("t") or 0) < spacing:
            out[-1] = dict(new)
            return out
    out.append(dict(new))
    if len(out) > MAX_SAMPLES:
        out = out[:1] + out[1:-1][1::2] + out[-1:]
    return out


#: A server's load is kept at the follower's pace for its latest hour (one sample per
#: ``RECENT_S / RECENT_SAMPLES`` seconds at most), and thinned to ``MAX_SAMPLES`` before that,
#: so a bottleneck's 30 s pattern reads the same after a day as after a minute.
RECENT_S = 3600.0
RECENT_SAMPLES = 720


def append_load(
    samples: Sequence[Mapping[str, Any]], new: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """``samples`` (load samples, oldest first, each with ``t`` in s) with ``new`` last: the
    latest hour kept one per ``RECENT_S / RECENT_SAMPLES`` s (a closer sample replaces the
    latest), what is older halved whenever it passes ``MAX_SAMPLES``."""
    t = float(new.get("t") or 0)
    out = [dict(s) for s in samples]
    old = [s for s in out if t - float(s.get("t") or 0) > RECENT_S]
    recent = out[len(old) :]
    spacing = RECENT_S / RECENT_SAMPLES
    if len(recent) >= 2 and t - float(recent[-2].get("t") or 0) < spacing:
        recent[-1] = dict(new)
    else:
        recent.append(dict(new))
    if len(old) > MAX_SAMPLES:
        old = old[:1] + old[1:][1::2]
    return old + recent


def lowest_available(samples: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The sample with the least MemAvailable (where host memory collapsed), if any."""
    known = [s for s in samples if isinstance(s.get("host_available_bytes"), int)]
    return min(known, key=lambda s: s["host_available_bytes"]) if known else None


@dataclass(frozen=True)
class Series:
    """One line: ``label`` names what it draws (``GPU 0–7`` where several GPUs drew the same
    line), ``count`` how many series it stands for."""

    label: str
    points: str  # SVG polyline points, "x,y x,y"
    peak_bytes: int
    count: int = 1
    peak_text: str = ""  # the peak in words, for a series that is not bytes


@dataclass(frozen=True)
class Marker:
    """A moment on a chart: ``kind`` is ``ready``, ``kill`` (the kernel's OOM killer) or
    ``oom`` (a CUDA out-of-memory); ``x`` in the SVG's coordinates, ``label`` what happened and
    the figures it said (the sampler, every few seconds, can miss the moment itself)."""

    kind: str
    t: float
    x: float
    label: str


@dataclass(frozen=True)
class Tick:
    """An axis label at ``percent`` of the axis (0 at the origin)."""

    label: str
    percent: float


@dataclass(frozen=True)
class Chart:
    """One panel: series scaled to ``width`` × ``height`` with the y axis from 0 to
    ``capacity_bytes``; ``duration_s`` is the x range; ticks on both axes, markers."""

    title: str
    capacity_bytes: int
    duration_s: float
    series: list[Series]
    unit: str  # how the page prints its sizes: host RAM in GB, GPU memory in GiB
    width: int = WIDTH
    height: int = HEIGHT
    markers: list[Marker] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)


@dataclass(frozen=True)
class Event:
    """Something that happened at ``t`` s into the launch, for the ``chart`` (``host`` or
    ``gpu``) it concerns: ``Marker.kind`` and its words."""

    chart: str
    kind: str
    t: float
    label: str


#: The kernel's OOM-kill line (mm/oom_kill.c): the victim and what it held, in kB.
OOM_KILL = re.compile(
    r"Killed process (?P<pid>\d+) \((?P<comm>[^)]*)\).*?anon-rss:(?P<anon>\d+)kB.*?"
    r"shmem-rss:(?P<shmem>\d+)kB"
)


def kill_events(kernel_lines: Sequence[str], t: float) -> list[Event]:
    """The kernel log's OOM kills as one host-chart event at ``t`` (the kernel log's own clock
    is not the launch's): who was killed and the memory each held then (anon + shmem RSS). The
    kernel kills one process at a time and takes its memory back before the next, so the
    figures are each victim's at its own kill, not a total held at once."""
    kills = [m for m in (OOM_KILL.search(str(line)) for line in kernel_lines) if m]
    if not kills:
        return []
    held = [(m, (int(m["anon"]) + int(m["shmem"])) * 1024) for m in kills]
    if len(held) == 1:
        ((m, size),) = held
        said = f"PID {m['pid']} ({m['comm']}) holding {format_bytes(size, 'GB')}"
    else:
        largest = max(size for _, size in held)
        pids = ", ".join(m["pid"] for m, _ in held[:8]) + ("…" if len(held) > 8 else "")
        said = (
            f"{len(held)} processes, one after another (PIDs {pids}); the largest held "
            f"{format_bytes(largest, 'GB')} when it was killed"
        )
    label = f"OOM kill (kernel log): {said}; host RAM was exhausted"
    return [Event("host", "kill", t, label)]


def charts(
    samples: Sequence[Mapping[str, Any]],
    gpu_totals: Mapping[int, int],
    events: Sequence[Event] = (),
) -> list[Chart]:
    """Host RAM used and the GPUs' used memory (GPUs that drew the same line as one line);
    ``[]`` with fewer than two samples. ``events`` become markers on their chart."""
    if len(samples) < 2:
        return []
    end = max([float(s.get("t") or 0) for s in samples] + [e.t for e in events]) or 1.0
    found = []
    host = [
        (float(s.get("t") or 0), s["host_total_bytes"] - s["host_available_bytes"])
        for s in samples
        if isinstance(s.get("host_total_bytes"), int)
        and isinstance(s.get("host_available_bytes"), int)
    ]
    if host:
        total = max(int(s.get("host_total_bytes") or 0) for s in samples)
        series = [_series("host", host, total, end)]
        found.append(_chart("Host RAM used", total, end, series, "GB", events, "host"))
    indexes = sorted({int(i) for s in samples for i in (s.get("gpus") or {})})
    if indexes:
        capacity = max([gpu_totals.get(i, 0) for i in indexes] + [1])
        lines: dict[tuple[tuple[float, int], ...], list[int]] = {}
        for index in indexes:
            points = tuple(
                (float(s.get("t") or 0), int(s["gpus"][str(index)]))
                for s in samples
                if str(index) in (s.get("gpus") or {})
            )
            lines.setdefault(points, []).append(index)
        series = [
            replace(_series(_gpus_label(group), list(points), capacity, end), count=len(group))
            for points, group in lines.items()
        ]
        found.append(_chart("GPU memory used", capacity, end, series, "GiB", events, "gpu"))
    return found


def _chart(
    title: str,
    capacity: int,
    end: float,
    series: list[Series],
    unit: str,
    events: Sequence[Event],
    kind: str,
) -> Chart:
    markers = [
        Marker(e.kind, e.t, round(e.t / end * WIDTH, 1), e.label)
        for e in events
        if e.chart in (kind, "all")
    ]
    y_ticks = [Tick(format_bytes(round(capacity * f), unit), f * 100) for f in (0, 0.5, 1)]
    x_ticks = [Tick(f"{end * f:,.0f} s", f * 100) for f in (0, 0.5, 1)]
    return Chart(title, capacity, end, series, unit, markers=markers, y_ticks=y_ticks,
                 x_ticks=x_ticks)  # fmt: skip


def _gpus_label(indexes: list[int]) -> str:
    """``GPU 3``, ``GPU 0–7`` (a run), ``GPU 0, 2, 5``."""
    if len(indexes) == 1:
        return f"GPU {indexes[0]}"
    if indexes == list(range(indexes[0], indexes[-1] + 1)):
        return f"GPU {indexes[0]}–{indexes[-1]} (the same on each)"
    return f"GPU {', '.join(map(str, indexes))} (the same on each)"


def _series(label: str, points: list[tuple[float, int]], capacity: int, end: float) -> Series:
    width, height = WIDTH, HEIGHT
    scaled = " ".join(
        f"{t / end * width:.1f},{height - min(b, capacity) / max(capacity, 1) * height:.1f}"
        for t, b in points
    )
    return Series(label, scaled, max((b for _, b in points), default=0))


#: The load charts of a server started with --enable-metrics: title, the series' figures and
#: labels, the axis top (``None``: the highest value), and how a value reads.
LOAD_CHARTS: tuple[tuple[str, tuple[tuple[str, str], ...], float | None, str], ...] = (
    ("KV token usage", (("token_usage", "device KV pool in use"),), 1.0, "percent"),
    (
        "Requests",
        (("num_running_reqs", "running"), ("num_queue_reqs", "waiting")),
        None,
        "count",
    ),
    ("Generation throughput", (("gen_throughput", "tokens/s"),), None, "rate"),
    ("Prefix cache hit rate", (("cache_hit_rate", "hits"),), 1.0, "percent"),
    ("Time to first token", (("ttft_s", "mean"),), None, "seconds"),
)


def load_charts(series: Sequence[Mapping[str, Any]], since: float = 0.0) -> list[Chart]:
    """The server's load (``Launch.metrics_series``) from ``since`` (s into the launch) to its
    latest sample, as charts like the memory ones: usage and hit rate from 0 to 100 %,
    requests and throughput from 0 to their highest; a chart whose figures the server never
    gave is left out. ``[]`` with fewer than two samples in the window."""
    series = [s for s in series if float(s.get("t") or 0) >= since]
    if len(series) < 2:
        return []
    start = since
    end = max(float(s.get("t") or 0) for s in series)
    span = (end - start) or 1.0
    found = []
    for title, figures, top, kind in LOAD_CHARTS:
        lines = []
        for key, label in figures:
            points = [
                (float(s.get("t") or 0), float(s[key]))
                for s in series
                if isinstance(s.get(key), int | float) and not isinstance(s.get(key), bool)
            ]
            if points:
                lines.append((label, points))
        if not lines:
            continue
        highest = top or max(max(v for _, v in pts) for _, pts in lines) or 1.0
        drawn = [
            Series(
                label,
                " ".join(
                    f"{(t - start) / span * WIDTH:.1f},"
                    f"{HEIGHT - min(v, highest) / highest * HEIGHT:.1f}"
                    for t, v in pts
                ),
                0,
                peak_text=f"{label}: peak {_said(max(v for _, v in pts), kind)}",
            )
            for label, pts in lines
        ]
        y_ticks = [Tick(_said(highest * f, kind), f * 100) for f in (0, 0.5, 1)]
        x_ticks = [Tick(f"{start + span * f:,.0f} s", f * 100) for f in (0, 0.5, 1)]
        found.append(Chart(title, 0, span, drawn, "", y_ticks=y_ticks, x_ticks=x_ticks))
    return found


def _said(value: float, kind: str) -> str:
    if kind == "percent":
        return f"{value * 100:.0f} %"
    if kind == "rate":
        return f"{value:,.0f} tokens/s"
    if kind == "seconds":
        return f"{value:,.2f} s"
    return f"{value:,.0f}"
