"""Launch-case bundles (format ``rankwise-case/1``, tests/fixtures/cases/FORMAT.md): the facts
document of a launch, built from what the panel recorded, in the shape the diagnosis reads.

Memory is integer bytes; times ISO 8601; unknown values ``None``.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from nodes.domain import timeline
from nodes.domain.units import format_bytes

FORMAT = "rankwise-case/1"


class BundleError(ValueError):
    """The bundle is not a readable ``rankwise-case/1`` folder or archive."""


def exit_of(code: int | None) -> dict[str, Any] | None:
    """How the server ended: ``{"code": -9, "signal": "SIGKILL"}``; ``None`` if unknown."""
    if code is None:
        return None
    doc: dict[str, Any] = {"code": code, "signal": None}
    if code < 0:
        with contextlib.suppress(ValueError):
            doc["signal"] = signal.Signals(-code).name
    return doc


def case_snapshot(snapshot: Mapping[str, Any], phase: str) -> dict[str, Any]:
    """A snapshot as Rankwise takes it on a node (launch control's ``snapshot`` plus the probe's
    GPUs) → the bundle's snapshot shape."""
    taken = snapshot.get("time")
    launch = snapshot.get("launch") or {}
    gpus = snapshot.get("gpus") or []
    doc: dict[str, Any] = {
        "phase": phase,
        "taken_at": (
            datetime.fromtimestamp(float(taken), UTC).isoformat().replace("+00:00", "Z")
            if isinstance(taken, int | float)
            else None
        ),
        "meminfo": dict(snapshot.get("meminfo") or {}),
        "gpus": [
            {
                "index": g.get("index"),
                "memory_total_bytes": g.get("memory_total_bytes"),
                "memory_used_bytes": g.get("memory_used_bytes"),
            }
            for g in gpus
        ],
        "gpu_processes": [
            {
                "gpu_index": g.get("index"),
                "pid": p.get("pid"),
                "name": p.get("name"),
                "used_memory_bytes": p.get("used_memory_bytes"),
            }
            for g in gpus
            for p in g.get("processes") or []
        ],
        "processes": [
            {
                "pid": m.get("pid"),
                "ppid": m.get("ppid"),
                "state": m.get("state"),
                "cmdline": m.get("command"),
            }
            for m in launch.get("members") or []
        ],
        "listening_ports": [{"port": p} for p in snapshot.get("listening_ports") or []],
        "kernel_log": list(snapshot.get("oom_lines") or []),
        "shm": {
            "used_bytes": sum(int(f.get("bytes") or 0) for f in snapshot.get("shm_files") or [])
        },
    }
    notes = [f"not collected: {e}" for e in snapshot.get("errors") or []]
    if others := snapshot.get("neighbours"):
        notes.append(neighbours_note(others))
    if notes:
        doc["notes"] = notes
    return doc


def neighbours_note(others: Sequence[Mapping[str, Any]]) -> str:
    """The other launches on the node (``[{"label", "host_bytes", "pinned"}]``) in words, as
    the diagnosis reads them back: ``other launches on the node with host memory committed:
    #12 (llama@1) 420 GB (pinned)``."""
    said = ", ".join(
        f"{o.get('label')} {format_bytes(int(o.get('host_bytes') or 0), 'GB')}"
        f" ({'pinned' if o.get('pinned') else 'not pinned yet'})"
        for o in others
    )
    return f"other launches on the node with host memory committed: {said}"


def timeline_snapshots(
    samples: Sequence[Mapping[str, Any]], started: datetime | None
) -> list[dict[str, Any]]:
    """Memory-timeline samples (``nodes.domain.timeline``) as bundle snapshots: the first is
    ``before_launch``; the one with the lowest MemAvailable after it, if lower, ``during``."""
    if not samples:
        return []
    first = samples[0]
    low = timeline.lowest_available(samples[1:])
    picked = [("before_launch", first)]
    if low is not None and low["host_available_bytes"] < (
        first.get("host_available_bytes") or 2**63
    ):
        picked.append(("during", low))
    docs = []
    for phase, s in picked:
        taken = None
        if started is not None:
            taken = (started + timedelta(seconds=float(s.get("t") or 0))).isoformat()
        docs.append(
            {
                "phase": phase,
                "taken_at": taken,
                "meminfo": {
                    "MemTotal": s.get("host_total_bytes"),
                    "MemAvailable": s.get("host_available_bytes"),
                },
                "gpus": [
                    {"index": int(i), "memory_used_bytes": b}
                    for i, b in (s.get("gpus") or {}).items()
                ],
            }
        )
    return docs


def launch_facts(
    *,
    engine_version: str | None,
    node: Mapping[str, Any],
    command: Sequence[str],
    env: Mapping[str, str] | None,
    exit_code: int | None,
    snapshots: Sequence[Mapping[str, Any]],
    model_config: Mapping[str, Any] | None = None,
    model_weights_bytes: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``facts.json`` of one launch (secrets must already be masked in ``command``/``env``).

    ``node``: ``{"name", "host_ram_bytes", "gpus": [{"index", "name", "memory_total_bytes"}]}``;
    ``snapshots``: bundle-shaped, oldest first (see ``case_snapshot``).
    """
    return {
        "format": FORMAT,
        "engine": "sglang",
        "engine_version": engine_version,
        "node": dict(node),
        "nodes_in_launch": 1,
        "command": list(command),
        "env": dict(env) if env is not None else None,
        "model_config": dict(model_config) if model_config is not None else None,
        "model_weights_bytes": model_weights_bytes,
        "exit": exit_of(exit_code),
        "snapshots": [dict(s) for s in snapshots],
        "extra": dict(extra or {}),
    }


def check_facts(doc: Any) -> dict[str, Any]:
    """``doc`` if it is a facts document this version reads; raises ``BundleError``."""
    if not isinstance(doc, dict):
        raise BundleError("facts.json is not a JSON object")
    if doc.get("format") != FORMAT:
        raise BundleError(f"facts.json is not {FORMAT} (format {doc.get('format')!r})")
    for key, kind in (("command", list), ("snapshots", list), ("node", dict)):
        if key in doc and doc[key] is not None and not isinstance(doc[key], kind):
            raise BundleError(f"facts.json: {key} must be a {kind.__name__}")
    return doc
