"""Template filters: sizes always printed with their unit; no queries."""

from __future__ import annotations

import json

from django import template

from nodes.domain.units import UNITS, format_bytes
from nodes.models import Gpu

register = template.Library()


@register.filter
def size(value: int | None, unit: str = "GiB") -> str:
    """``{{ node.host_ram_bytes|size:"GB" }}`` → ``"449 GB"``; an unknown size reads "unknown"."""
    if value is None or isinstance(value, bool):
        return "unknown"
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return "unknown"
    return format_bytes(number, unit if unit in UNITS else "GiB")


@register.filter
def as_json(value: object) -> str:
    """Pretty JSON for audit before/after snapshots; ``None`` reads as an em dash."""
    if value is None:
        return "—"
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@register.filter
def status_badge(status: str) -> str:
    """CSS class for a node status badge."""
    return f"badge badge-{status}"


def _bar(used: int, total: int, label: str) -> dict[str, object]:
    percent = min(100, round(100 * used / total)) if total else 0
    return {"used": used, "total": total, "percent": percent, "label": label}


@register.inclusion_tag("nodes/_usage_bar.html")
def gpu_bar(gpu: Gpu) -> dict[str, object]:
    """A GPU's memory as a bar: "94.2 / 96 GiB used"."""
    used, total = gpu.memory_used_bytes or 0, gpu.memory_total_bytes
    return _bar(used, total, f"{format_bytes(used).split()[0]} / {format_bytes(total)} used")


@register.inclusion_tag("nodes/_usage_bar.html")
def usage_bar(total: int, available: int | None, unit: str = "GB") -> dict[str, object]:
    """Host RAM as a bar: used = total − available, both with the unit."""
    if available is None:
        return _bar(0, total, f"{format_bytes(total, unit)} total, available unknown")
    used = max(0, total - available)
    label = (
        f"{format_bytes(used, unit)} used, {format_bytes(available, unit)} available "
        f"of {format_bytes(total, unit)}"
    )
    return _bar(used, total, label)
