"""Template filters: sizes always printed with their unit; no queries."""

from __future__ import annotations

import json

from django import template

from nodes.domain.units import UNITS, format_bytes

register = template.Library()


@register.filter
def size(value: int | None, unit: str = "GiB") -> str:
    """``{{ node.host_ram_bytes|size:"GB" }}`` → ``"449 GB"``; an unknown size reads "unknown"."""
    if value is None:
        return "unknown"
    return format_bytes(int(value), unit if unit in UNITS else "GiB")


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
