"""A launch's memory over time: samples of host RAM and each GPU's used memory taken during
start-up, kept to a bounded number, and drawn as SVG polylines for the launch page.

A sample is ``{"t": seconds since the launch began, "host_total_bytes", "host_available_bytes",
"gpus": {"<index>": used bytes}}``; host RAM *used* is total − MemAvailable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


def lowest_available(samples: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The sample with the least MemAvailable (where host memory collapsed), if any."""
    known = [s for s in samples if isinstance(s.get("host_available_bytes"), int)]
    return min(known, key=lambda s: s["host_available_bytes"]) if known else None


@dataclass(frozen=True)
class Series:
    label: str
    points: str  # SVG polyline points, "x,y x,y"
    peak_bytes: int


@dataclass(frozen=True)
class Chart:
    """One panel: series scaled to ``width`` × ``height`` with the y axis from 0 to
    ``capacity_bytes``; ``duration_s`` is the x range."""

    title: str
    capacity_bytes: int
    duration_s: float
    series: list[Series]
    unit: str  # how the page prints its sizes: host RAM in GB, GPU memory in GiB
    width: int = WIDTH
    height: int = HEIGHT


def charts(samples: Sequence[Mapping[str, Any]], gpu_totals: Mapping[int, int]) -> list[Chart]:
    """Host RAM used and each GPU's used memory; ``[]`` with fewer than two samples."""
    if len(samples) < 2:
        return []
    end = max(float(s.get("t") or 0) for s in samples) or 1.0
    found = []
    host = [
        (float(s.get("t") or 0), s["host_total_bytes"] - s["host_available_bytes"])
        for s in samples
        if isinstance(s.get("host_total_bytes"), int)
        and isinstance(s.get("host_available_bytes"), int)
    ]
    if host:
        total = max(int(s.get("host_total_bytes") or 0) for s in samples)
        found.append(Chart("Host RAM used", total, end, [_series("host", host, total, end)], "GB"))
    indexes = sorted({int(i) for s in samples for i in (s.get("gpus") or {})})
    if indexes:
        capacity = max([gpu_totals.get(i, 0) for i in indexes] + [1])
        series = []
        for index in indexes:
            points = [
                (float(s.get("t") or 0), int(s["gpus"][str(index)]))
                for s in samples
                if str(index) in (s.get("gpus") or {})
            ]
            series.append(_series(f"GPU {index}", points, capacity, end))
        found.append(Chart("GPU memory used", capacity, end, series, "GiB"))
    return found


def _series(label: str, points: list[tuple[float, int]], capacity: int, end: float) -> Series:
    width, height = WIDTH, HEIGHT
    scaled = " ".join(
        f"{t / end * width:.1f},{height - min(b, capacity) / max(capacity, 1) * height:.1f}"
        for t, b in points
    )
    return Series(label, scaled, max((b for _, b in points), default=0))
