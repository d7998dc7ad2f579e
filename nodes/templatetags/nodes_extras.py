"""Template filters: sizes always printed with their unit; no queries."""

from __future__ import annotations

import json
import math
import re
from datetime import timedelta
from typing import Any

from django import template
from django.urls import reverse

from nodes.domain import audit_changes as audit_words
from nodes.domain import figure_labels, launch_plan, remedy
from nodes.domain.launch_plan import IDLE_GPU_BYTES
from nodes.domain.ownership import HostShare
from nodes.domain.units import UNITS, format_bytes
from nodes.models import Gpu
from nodes.services.fleet import GpuView

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
def minutes(value: timedelta | None) -> str:
    """A duration in whole minutes, rounded up: "1 minute", "15 minutes"."""
    if value is None:
        return ""
    count = max(1, math.ceil(value.total_seconds() / 60))
    return f"{count} minute{'s' if count != 1 else ''}"


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


@register.inclusion_tag("nodes/_stacked_bar.html")
def gpu_owner_bar(view: GpuView) -> dict[str, object]:
    """A GPU's memory by owner as one stacked bar: ours, committed not yet taken, foreign,
    ghost, free; each part titled with its size in GiB."""
    o = view.owners
    parts = [
        ("ours", o.ours_bytes, "ours: " + ", ".join(view.labels.get(i, f"#{i}") for i in o.ours)),
        ("committed", view.waiting_bytes, f"committed by {view.reserved}, not taken yet"),
        ("foreign", o.foreign_bytes, "foreign: " + ", ".join(f"PID {f.pid}" for f in o.foreign)),
        ("ghost", o.ghost_bytes, "ghost: held with no process"),
    ]
    return _stacked(parts, o.total_bytes, "GiB")


@register.inclusion_tag("nodes/_stacked_bar.html")
def host_share_bar(share: HostShare) -> dict[str, object]:
    """Host RAM as one stacked bar: pinned by launches, committed by launches not yet pinned,
    used besides, free (GB)."""
    parts = [
        ("ours", share.pinned_bytes, "pinned by launches (their host pools)"),
        ("committed", share.committed_bytes, "committed by launches that have not pinned yet"),
        ("used", share.used_bytes, "used besides the launches' commitments"),
    ]
    return _stacked(parts, share.total_bytes, "GB")


def _stacked(parts: list[tuple[str, int, str]], total: int, unit: str) -> dict[str, object]:
    shown = [
        {
            "kind": kind,
            "percent": round(min(100.0, 100 * size / total), 2) if total else 0,
            "title": f"{title} ({format_bytes(size, unit)})",
            "bytes": size,
        }
        for kind, size, title in parts
        if size > 0
    ]
    used = sum(p["bytes"] for p in shown)  # type: ignore[misc]
    free = max(0, total - used)
    summary = ", ".join(f"{p['kind']} {format_bytes(int(p['bytes']), unit)}" for p in shown)
    label = (summary + ", " if summary else "") + f"free {format_bytes(free, unit)}"
    return {"parts": shown, "label": f"{label} of {format_bytes(total, unit)}"}


@register.filter
def figure_label(key: str) -> str:
    """A diagnosis figure's key in words, with its unit (``figure_labels.label``)."""
    return figure_labels.label(str(key))


@register.filter
def code_warning(revision: Any) -> str:
    """What a revision lets run in the server besides SGLang, as whom on its node
    (``launch_plan.code_on_node``); "" when nothing."""
    node = getattr(revision, "node", None)
    user = node.server_user if node is not None else "the node's server user"
    said = launch_plan.code_on_node(list(revision.args or []), user, node.name if node else "")
    return said or ""


@register.filter
def figure_value(figure: Any, key: str) -> str:
    """A figure as an operator reads it (``figure_labels.value``): ``{{ v|figure_value:k }}``."""
    return figure_labels.value(str(key), figure)


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    """``mapping[key]`` in a template (None when absent)."""
    return mapping.get(key) if isinstance(mapping, dict) else None


@register.filter
def change_text(changes: Any) -> str:
    """A flag change as a command spells it (``remedy.describe``): ``--hicache-size 37``."""
    return remedy.describe(changes) if isinstance(changes, dict) else ""


@register.filter
def gpu_use(gpus: Any) -> str:
    """A node's GPUs as last read, in one phrase: ``3 of 8 in use, 301.5 of 1,128 GiB``;
    "not read" before any reading."""
    rows = list(gpus)
    read = [g for g in rows if g.memory_used_bytes is not None]
    if not read:
        return "not read"
    busy = sum(1 for g in read if g.memory_used_bytes > IDLE_GPU_BYTES)
    used = sum(g.memory_used_bytes for g in read)
    total = sum(g.memory_total_bytes for g in read)
    return (
        f"{busy} of {len(rows)} in use, {format_bytes(used, 'GiB')} of {format_bytes(total, 'GiB')}"
    )


@register.filter
def audit_changes(entry: Any) -> list[audit_words.Change]:
    """An audit entry's changed fields, in words (``audit_changes.changes``)."""
    return audit_words.changes(entry.before, entry.after)


#: The page of each kind of object an audit entry names (its ``object_type``).
OBJECT_PAGES = {
    "node": "nodes:node-detail",
    "launchprofile": "nodes:profile-detail",
    "launch": "nodes:launch-detail",
    "cleanup": "nodes:cleanup-detail",
}


@register.filter
def audit_object_url(entry: Any) -> str:
    """The page of the object an audit entry names, or ``""`` (a user, a deleted object's id
    still links: its page answers 404)."""
    name = OBJECT_PAGES.get(str(entry.object_type))
    if name is None or not re.fullmatch(r"[0-9]{1,18}", str(entry.object_id)):
        return ""
    return reverse(name, args=[int(entry.object_id)])
