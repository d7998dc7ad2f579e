"""Whose memory is on a node: each GPU's used memory split between Rankwise launches (ours),
other processes (foreign: PID, user, command) and memory no process holds (ghost), and the
host RAM split between what launches pinned, what they committed and have not pinned yet, what
is used besides, and what is free. All sizes are bytes. Input: the GPU processes a probe read
(NVML's, with the ``RANKWISE_LAUNCH_ID`` each carries), the node's commitments."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodes.domain.launch_plan import IDLE_GPU_BYTES
from nodes.domain.units import format_bytes


@dataclass(frozen=True)
class Foreign:
    """A process that is not a Rankwise launch's, holding ``bytes`` of a GPU."""

    pid: int
    user: str | None
    command: str
    bytes: int


@dataclass(frozen=True)
class GpuOwners:
    """One GPU's used memory by owner: ``ours`` launch id → bytes, ``foreign`` processes,
    ``ghost`` bytes held with no process; ``reserved_by`` the launch that has it reserved."""

    index: int
    total_bytes: int
    used_bytes: int
    ours: dict[int, int] = field(default_factory=dict)
    foreign: tuple[Foreign, ...] = ()
    ghost_bytes: int = 0
    reserved_by: int | None = None

    @property
    def ours_bytes(self) -> int:
        return sum(self.ours.values())

    @property
    def foreign_bytes(self) -> int:
        return sum(f.bytes for f in self.foreign)

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - self.used_bytes)


def gpu_owners(
    index: int,
    total_bytes: int,
    used_bytes: int,
    processes: Iterable[Mapping[str, Any]],
    reserved_by: int | None = None,
) -> GpuOwners:
    """Split a GPU's used memory by its processes (``pid``, ``name``, ``used_memory_bytes``,
    ``launch_id``, ``user``). A process whose own figure is unknown (0, as NVML reports in some
    containers) gets an even share of what the known ones leave; with no process at all, used
    memory beyond the driver's own is a ghost."""
    listed = list(processes)
    known = sum(int(p.get("used_memory_bytes") or 0) for p in listed)
    unknown = [p for p in listed if not p.get("used_memory_bytes")]
    rest = max(0, used_bytes - known)
    share = rest // len(unknown) if unknown else 0
    ours: dict[int, int] = {}
    foreign: list[Foreign] = []
    for p in listed:
        size = int(p.get("used_memory_bytes") or 0) or share
        launch = p.get("launch_id")
        if isinstance(launch, int):
            ours[launch] = ours.get(launch, 0) + size
        else:
            name = str(p.get("name") or "")
            foreign.append(Foreign(int(p["pid"]), p.get("user"), name, size))
    ghost = 0
    if not listed and used_bytes > IDLE_GPU_BYTES:
        ghost = used_bytes
    elif not unknown and rest > IDLE_GPU_BYTES:
        ghost = rest
    return GpuOwners(index, total_bytes, used_bytes, ours, tuple(foreign), ghost, reserved_by)


def why_taken(owners: GpuOwners, *, quarantined: bool = False) -> str | None:
    """Why a new launch cannot take this GPU now (reserved, quarantined, held by a process of
    ours or a foreign one, memory held by no process, memory in use beyond the driver's own),
    as ``"GPU 2: held by a foreign process (PID 77, bob, python3 train.py, 10 GiB)"``; None
    when it is free."""
    index = owners.index
    if owners.reserved_by is not None:
        return f"GPU {index}: reserved by launch #{owners.reserved_by}"
    if quarantined:
        return f"GPU {index}: quarantined"
    if owners.foreign:
        held = "; ".join(
            f"PID {f.pid}, {f.user or 'user unknown'}, {f.command or '?'}, "
            f"{format_bytes(f.bytes, 'GiB')}"
            for f in owners.foreign
        )
        return f"GPU {index}: held by a foreign process ({held})"
    if owners.ours:
        return f"GPU {index}: held by a process of launch " + ", ".join(
            f"#{launch}" for launch in sorted(owners.ours)
        )
    if owners.ghost_bytes:
        return f"GPU {index}: {format_bytes(owners.ghost_bytes, 'GiB')} held by no process"
    if owners.used_bytes > IDLE_GPU_BYTES:
        return f"GPU {index}: {format_bytes(owners.used_bytes, 'GiB')} in use"
    return None


def escaped(owners: Iterable[GpuOwners], ended: Iterable[int]) -> list[tuple[int, int]]:
    """``(GPU index, launch id)`` of every GPU that a launch in ``ended`` (ended launches) still
    holds memory on: one of its processes escaped its end (re-parented, not killed)."""
    gone = set(ended)
    return [(g.index, launch) for g in owners for launch in sorted(g.ours) if launch in gone]


@dataclass(frozen=True)
class HostShare:
    """A node's host RAM: ``pinned`` by launches (host pools they allocated), ``committed`` by
    launches that have not pinned theirs yet (they will once loaded), ``used`` besides, ``free``
    (MemAvailable less what is committed and not yet pinned)."""

    total_bytes: int
    pinned_bytes: int
    committed_bytes: int
    used_bytes: int
    free_bytes: int


def host_share(
    total: int | None, available: int | None, committed: Iterable[tuple[int, bool]]
) -> HostShare | None:
    """The host RAM of a node that read ``total`` and ``available`` (bytes), with commitments
    ``(bytes, pinned)``; None when the node's RAM is unknown."""
    if not total:
        return None
    rows = list(committed)
    all_committed = sum(size for size, _ in rows)
    waiting = sum(size for size, pinned in rows if not pinned)
    free = max(0, (available if available is not None else total) - waiting)
    used = max(0, total - free - all_committed)
    return HostShare(total, all_committed - waiting, waiting, used, free)
