"""Who holds a node's GPUs, and the state of each GPU: ``free``, ``held`` or ``quarantined``.

Holders come from two readings of the node: NVML's compute processes (pid and memory per GPU)
and the processes with ``/dev/nvidia*`` open (what ``fuser -v /dev/nvidia*`` reads; it also
sees holders NVML does not list, e.g. in another PID namespace). A holder belongs to a Rankwise
launch when it carries the launch's ``RANKWISE_LAUNCH_ID`` or is in the process group or
session recorded for the launch on the node. GPU memory used while no process holds the GPU is
"orphaned": only a GPU reset or a reboot returns it.

Memory is integer bytes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GiB = 2**30
#: A GPU reading at most this much with no process is idle (the driver's own context and
#: reserved memory show as used on a real GPU; NVIDIA's ``nvidia-smi`` reports it).
IDLE_GPU_BYTES = 1 * GiB


@dataclass
class Holder:
    """One process holding GPUs: ``gpus`` by index, ``used_bytes`` as NVML attributes it (0
    when only its open device files show it), ``launch_id`` when it is a Rankwise launch's."""

    pid: int
    ppid: int | None = None
    state: str = "?"
    command: str = ""
    pgid: int | None = None
    sid: int | None = None
    elapsed_s: float | None = None
    gpus: list[int] = field(default_factory=list)
    used_bytes: dict[int, int] = field(default_factory=dict)
    launch_id: int | None = None
    seen_by: list[str] = field(default_factory=list)  # "nvml", "device files", "launch group"
    start: int | None = None  # start time in clock ticks: with the PID, which process it is
    # A launch of a team-only profile the reader is not in: no launch id, no command shown.
    team_only: bool = False

    @property
    def target(self) -> str:
        """How a signal names exactly this process (``PID@START``): a PID reused since it was
        read is not the same target."""
        return f"{self.pid}@{self.start}" if self.start is not None else str(self.pid)

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "ppid": self.ppid,
            "state": self.state,
            "command": self.command,
            "launch_id": self.launch_id,
            "team_only": self.team_only,
        }


@dataclass
class GpuState:
    index: int
    state: str  # free | held | quarantined
    memory_total_bytes: int
    memory_used_bytes: int
    orphaned_bytes: int
    holders: list[Holder]
    quarantine_reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "state": self.state,
            "memory_used_bytes": self.memory_used_bytes,
            "orphaned_bytes": self.orphaned_bytes,
            "holders": [h.to_json() for h in self.holders],
            "quarantine_reason": self.quarantine_reason or None,
        }


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def holders(
    processes: Iterable[Mapping[str, Any]],
    gpus: Iterable[Mapping[str, Any]],
    launch_groups: Mapping[int, int],
    ended_groups: Mapping[int, tuple[int, float | None]] | None = None,
) -> list[Holder]:
    """Every process holding a GPU or belonging to a launch, merged by PID.

    ``processes``: the node's processes with open NVIDIA devices or launch membership
    (``gpuctl inspect``: pid, ppid, state, pgid, sid, command, elapsed_s, devices,
    launch_marker); ``gpus``: NVML's view (index, processes with pid and used_memory_bytes);
    ``launch_groups``: process group (= session) id → Rankwise launch id, for groups whose
    leader is still the launch's supervisor; ``ended_groups``: group id → (launch id, when the
    panel saw the launch end, epoch seconds) for groups whose leader is gone. A process in such
    a group whose marker cannot be read (D state) counts as the launch's only if it started
    before the launch ended: a group id is reused only after every member of the old group is
    gone.
    """
    found: dict[int, Holder] = {}
    for p in processes:
        pid = _int(p.get("pid"))
        if pid is None:
            continue
        holder = found.setdefault(pid, Holder(pid))
        holder.ppid, holder.state = _int(p.get("ppid")), str(p.get("state") or "?")
        holder.command = str(p.get("command") or "")
        holder.pgid, holder.sid = _int(p.get("pgid")), _int(p.get("sid"))
        holder.elapsed_s = p.get("elapsed_s")
        holder.start = _int(p.get("start"))
        devices = [int(d) for d in p.get("devices") or [] if str(d).isdigit()]
        if devices:
            holder.seen_by.append("device files")
        holder.gpus = sorted(set(holder.gpus) | set(devices))
        marker = _int(p.get("launch_marker"))
        group = launch_groups.get(holder.pgid or -1) or launch_groups.get(holder.sid or -1)
        old = (ended_groups or {}).get(holder.pgid or -1)
        started = p.get("started_at")
        if group is None and marker is None and old is not None and isinstance(started, float):
            launch, ended = old
            group = launch if ended is not None and started < ended else None
        holder.launch_id = marker or group
        if group and not devices:
            holder.seen_by.append("launch group")
    for gpu in gpus:
        index = _int(gpu.get("index"))
        for p in gpu.get("processes") or []:
            pid = _int(p.get("pid"))
            if pid is None or index is None:
                continue
            holder = found.setdefault(pid, Holder(pid, command=str(p.get("name") or "")))
            holder.used_bytes[index] = int(p.get("used_memory_bytes") or 0)
            holder.gpus = sorted(set(holder.gpus) | {index})
            if "nvml" not in holder.seen_by:
                holder.seen_by.append("nvml")
    return sorted(found.values(), key=lambda h: h.pid)


def gpu_states(
    gpus: Iterable[Mapping[str, Any]],
    found: Sequence[Holder],
    quarantined: Mapping[int, str],
) -> list[GpuState]:
    """Each GPU's state: ``quarantined`` when the panel quarantined it; ``held`` when a live
    process holds it or it uses more than ``IDLE_GPU_BYTES``; else ``free``."""
    states = []
    for gpu in gpus:
        index = int(gpu["index"])
        used = int(gpu.get("memory_used_bytes") or 0)
        mine = [h for h in found if index in h.gpus and h.state not in ("Z", "X")]
        orphaned = used if not mine and used > IDLE_GPU_BYTES else 0
        state = "held" if mine or used > IDLE_GPU_BYTES else "free"
        if index in quarantined:
            state = "quarantined"
        states.append(
            GpuState(
                index=index,
                state=state,
                memory_total_bytes=int(gpu.get("memory_total_bytes") or 0),
                memory_used_bytes=used,
                orphaned_bytes=orphaned,
                holders=mine,
                quarantine_reason=quarantined.get(index, ""),
            )
        )
    return states


def host_state(
    meminfo: Mapping[str, int],
    shm: Sequence[Mapping[str, Any]],
    available_before: int | None = None,
) -> dict[str, Any]:
    """Host memory that should have come back: MemAvailable against what the node had before
    the launch, pinned pages (``Mlocked``, ``Unevictable``), files left in /dev/shm."""
    available = meminfo.get("MemAvailable")
    doc: dict[str, Any] = {
        "mem_total_bytes": meminfo.get("MemTotal"),
        "mem_available_bytes": available,
        "mlocked_bytes": meminfo.get("Mlocked"),
        "unevictable_bytes": meminfo.get("Unevictable"),
        "shm_files": [dict(f) for f in shm],
        "shm_bytes": sum(int(f.get("bytes") or 0) for f in shm),
    }
    if available_before is not None and available is not None:
        doc["available_before_bytes"] = available_before
        doc["not_returned_bytes"] = max(available_before - available, 0)
    return doc


@dataclass(frozen=True)
class Targets:
    """What each escalating step of a cleanup acts on."""

    group: int | None  # the launch's process group (steps a, b)
    strays: list[int]  # the launch's processes outside it (step c)
    defunct: list[int]  # the launch's defunct processes (step d)
    foreign: list[int]  # other holders of the chosen GPUs the operator named (step e)
    untouched: list[Holder]  # other holders nobody named: left alone, reported
    # Named holders of launches the operator may not end (another team's team-only launch):
    # never signalled, whatever was named.
    refused: list[Holder] = field(default_factory=list)


def targets(
    found: Sequence[Holder],
    *,
    launch_id: int | None,
    group: int | None,
    chosen: Sequence[int],
    named_foreign: Iterable[int],
    protected: Collection[int] = (),
) -> Targets:
    """Split the holders: the launch's own (by marker, group or session), defunct ones, and the
    foreign holders of the chosen GPUs — killed only when the operator named their PID.
    Processes of the launches in ``protected`` (ids) are never a target, even when named:
    they are listed in ``refused`` when named, else in ``untouched``."""
    wanted = set(named_foreign)
    guarded = {h.pid for h in found if h.launch_id is not None and h.launch_id in protected}
    refused = [h for h in found if h.pid in guarded and h.pid in wanted]
    named = wanted - guarded
    ours = [h for h in found if launch_id is not None and h.launch_id == launch_id]
    strays = [
        h.pid
        for h in ours
        if h.state not in ("Z", "X") and (group is None or h.pgid != group) and h.pid != group
    ]
    defunct = [h.pid for h in found if h.state == "Z" and (h in ours or h.pid in named)]
    others = [
        h
        for h in found
        if h not in ours and h.state not in ("Z", "X") and set(h.gpus) & set(chosen)
    ]
    return Targets(
        group=group,
        strays=strays,
        defunct=defunct,
        foreign=[h.pid for h in others if h.pid in named],
        untouched=[h for h in others if h.pid not in named and h not in refused],
        refused=refused,
    )
