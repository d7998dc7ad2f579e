"""Rules for GPU memory that someone else holds: another process (seen by SGLang's balance check,
named in PyTorch's OOM text, or hidden in another PID namespace), or nobody (leaked after a
cleanup).

Each rule reads its figures first (a frozen dataclass, or ``None`` when the rule does not apply)
and words them second. The leak after a cleanup is only read and worded here: the rule that adds
why the launch failed before the cleanup runs the other rules, so it lives in ``engine``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodes.domain.diagnosis.evidence import (
    LOAD_BEGIN,
    LOAD_END,
    Bundle,
    Diagnosis,
    Evidence,
    Hit,
    _num,
)
from nodes.domain.diagnosis.host_pools import _available_before
from nodes.domain.diagnosis.pytorch_oom import (
    OOM_BEFORE_2_1,
    OOM_WITH_HOLDER,
    OTHER_PROCESS,
    OUTSIDE_MIN_GIB,
    OUTSIDE_SHARE,
    gib_of,
    oom_figures,
)

UNBALANCED = re.compile(
    r"The memory capacity is unbalanced\..*?min_per_gpu_memory=(?P<min>[\d.]+), "
    r"local_gpu_memory=(?P<local>[\d.]+)"
)


def gpu_unbalanced(bundle: Bundle) -> Diagnosis | None:
    """SGLang's check that every TP GPU has at least 90 % of the local GPU's free memory
    (``model_runner.py``, §6): another process holds memory on one of them."""
    hit = bundle.log.first(UNBALANCED)
    if hit is None:
        return None
    low, local = _num(hit[1]["min"]), _num(hit[1]["local"])
    return Diagnosis(
        category="gpu-occupied-by-other-process",
        summary=(
            f"TP GPUs have unequal free memory: the least-free GPU has {low:.2f} GB vs "
            f"{local:.2f} GB on the local GPU (below 0.9 x {local:.2f} = {0.9 * local:.2f} GB), so "
            "another process is occupying one GPU, or the GPUs are not alike"
        ),
        remedy=(
            "kill processes occupying GPU memory (see the node's GPU holders), or choose idle "
            "GPUs (CUDA_VISIBLE_DEVICES) of one model; the check can be bypassed "
            "(SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK in 0.5.2, "
            "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=0 later) only with homogeneous GPUs"
        ),
        evidence=[bundle.evidence(hit)],
        numbers={
            "min_per_gpu_memory_gb": round(low, 2),
            "local_gpu_memory_gb": round(local, 2),
            "threshold_gb": round(0.9 * local, 2),
            "imbalance_ratio": 0.9,
        },
    )


@dataclass(frozen=True)
class Holder:
    """A process the node lists on a GPU, with what ``ps`` says of it (state None: not seen)."""

    pid: int
    gpu: int | None
    used_bytes: float | None
    name: str
    ppid: int | None
    state: str | None

    @property
    def alive(self) -> bool:
        return self.state is not None and self.state[:1] not in ("Z", "X")

    @property
    def orphan(self) -> bool:
        """An inference-server process re-parented to init: its launcher is gone (§4)."""
        return self.ppid == 1 and re.match(r"(?:sglang|VLLM)::", self.name) is not None


def _gpu_holders(bundle: Bundle) -> list[Holder]:
    """The GPU processes of the latest snapshot that lists any, joined with ``ps`` facts."""
    processes: dict[int, Mapping[str, Any]] = {}
    listed: list[Mapping[str, Any]] = []
    for snapshot in bundle.snapshots():
        for process in snapshot.get("processes") or []:
            if isinstance(process.get("pid"), int):
                processes[process["pid"]] = process
        if snapshot.get("gpu_processes"):
            listed = snapshot["gpu_processes"]
    holders = []
    for entry in listed:
        pid = entry.get("pid")
        if not isinstance(pid, int):
            continue
        process = processes.get(pid, {})
        holders.append(
            Holder(
                pid,
                entry.get("gpu_index"),
                entry.get("used_memory_bytes"),
                str(entry.get("name") or process.get("cmdline") or ""),
                process.get("ppid"),
                process.get("state"),
            )
        )
    return holders


def _while_loading(bundle: Bundle, hit: Hit) -> bool:
    """Whether ``hit`` came after ``Load weight begin`` and before any ``Load weight end``."""
    begin, end = bundle.log.first(LOAD_BEGIN), bundle.log.first(LOAD_END)
    return bool(begin) and (end is None or end[0] > hit[0])


@dataclass(frozen=True)
class OutsideAtOom:
    """An OOM in PyTorch's text before 2.1 with more of the card held outside this process's
    PyTorch than its own context and buffers take: ``figures`` as ``oom_figures`` gives them
    (GiB), on GPU ``gpu``."""

    hit: Hit
    gpu: int
    figures: Mapping[str, float]
    while_loading: bool


def _outside_at_oom(bundle: Bundle) -> OutsideAtOom | None:
    hit = bundle.log.first(OOM_BEFORE_2_1)
    if hit is None:
        return None
    figures, gpu = oom_figures(hit[1]), int(hit[1]["gpu"])
    if figures["outside"] <= max(OUTSIDE_MIN_GIB, OUTSIDE_SHARE * figures["total"]):
        return None
    return OutsideAtOom(hit, gpu, figures, _while_loading(bundle, hit))


def gpu_held_outside_at_oom(bundle: Bundle) -> Diagnosis | None:
    """PyTorch before 2.1 names no other process in its OOM text, but says how much of the card
    is free and how much this process's PyTorch reserved: the rest (total − free − reserved) is
    held by something else, another process or memory of this one outside PyTorch. More than
    ``OUTSIDE_MIN_GIB`` and ``OUTSIDE_SHARE`` of the card is more than a CUDA context and
    NCCL's buffers: another holder. Numbers in GiB: ``others_held_gib``, ``free_gib``,
    ``reserved_gib``, ``allocated_gib``, ``gpu_total_gib``, ``tried_to_allocate_gib``; ``gpu``."""
    found = _outside_at_oom(bundle)
    return None if found is None else _outside_at_oom_diagnosis(bundle, found)


def _outside_at_oom_diagnosis(bundle: Bundle, found: OutsideAtOom) -> Diagnosis:
    figures, gpu = found.figures, found.gpu
    when = " while loading the weights" if found.while_loading else ""
    return Diagnosis(
        category="gpu-occupied-by-other-process",
        summary=(
            f"{bundle.gpu_named(gpu)} is occupied outside this launch: of its "
            f"{figures['total']:.2f} GiB only "
            f"{figures['free']:.2f} GiB was free and this process's PyTorch reserved "
            f"{figures['reserved']:.2f} GiB, so {figures['outside']:.2f} GiB is held by another "
            f"process (or outside PyTorch); this launch ran out of memory{when} (allocating "
            f"{figures['tried']:.2f} GiB)"
        ),
        remedy=(
            f"find what holds {bundle.gpu_named(gpu)} (nvidia-smi --query-compute-apps=pid,"
            "used_memory, or the "
            "node's GPU holders) and stop it, or launch on idle GPUs (CUDA_VISIBLE_DEVICES); add "
            "a pre-launch GPU idle check"
        ),
        evidence=[bundle.evidence(found.hit)],
        numbers={
            "gpu": gpu,
            "others_held_gib": round(figures["outside"], 2),
            "free_gib": round(figures["free"], 2),
            "reserved_gib": round(figures["reserved"], 2),
            "allocated_gib": round(figures["allocated"], 2),
            "gpu_total_gib": round(figures["total"], 2),
            "tried_to_allocate_gib": round(figures["tried"], 2),
        },
    )


def _live_orphans(holders: Sequence[Holder]) -> list[Holder]:
    """The live server processes among ``holders`` re-parented to PID 1."""
    return [h for h in holders if h.alive and h.orphan]


def _mib(holder: Holder) -> int:
    return round((holder.used_bytes or 0) / 2**20)


def _orphan_numbers(orphans: Sequence[Holder]) -> dict[str, float]:
    if not orphans:
        return {}
    numbers: dict[str, float] = {"orphans": len(orphans), "orphan_ppid": 1}
    for holder in orphans:
        numbers[f"orphan_{holder.pid}_mib"] = _mib(holder)
    numbers["orphan_mib_total"] = sum(_mib(h) for h in orphans)
    return numbers


def _orphan_text(orphans: Sequence[Holder]) -> str:
    """The orphans in words, to end a summary with; empty without any."""
    if not orphans:
        return ""
    gpus = sorted({h.gpu for h in orphans if h.gpu is not None})
    return (
        f"; the node shows {len(orphans)} live server processes re-parented to PPID 1 "
        f"({', '.join(h.name for h in orphans[:4])}) holding "
        f"{' + '.join(str(_mib(h)) for h in orphans)} MiB"
        + (f" = {sum(_mib(h) for h in orphans)} MiB" if len(orphans) > 1 else "")
        + (f" on GPUs {', '.join(map(str, gpus))}" if gpus else "")
        + ", left over from an earlier launch"
    )


@dataclass(frozen=True)
class HeldAtOom:
    """PyTorch's OOM text with other processes on the GPU: sizes in GiB, ``others`` as
    (PID, GiB) in the text's order, and the node's GPU processes (``holders``)."""

    hit: Hit
    gpu: int
    total: float
    free: float
    tried: float
    others: tuple[tuple[int, float], ...]
    while_loading: bool
    holders: tuple[Holder, ...]

    @property
    def biggest(self) -> tuple[int, float]:
        """(PID, GiB) of the process holding the most, the first of equals."""
        return max(self.others, key=lambda other: other[1])

    @property
    def held(self) -> float:
        """GiB all the other processes hold together."""
        return sum(each for _, each in self.others)


def _held_at_oom(bundle: Bundle) -> HeldAtOom | None:
    hit = bundle.log.first(OOM_WITH_HOLDER)
    if hit is None:
        return None
    match = hit[1]
    others = [
        (int(m["pid"]), gib_of(m["used"])) for m in OTHER_PROCESS.finditer(match["processes"])
    ]
    if not others:
        return None
    return HeldAtOom(
        hit,
        int(match["gpu"]),
        total=gib_of(match["total"]),
        free=gib_of(match["free"]),
        tried=gib_of(match["tried"]),
        others=tuple(others),
        while_loading=_while_loading(bundle, hit),
        holders=tuple(_gpu_holders(bundle)),
    )


def gpu_held_at_oom(bundle: Bundle) -> Diagnosis | None:
    """PyTorch's OOM text names other processes holding memory on the GPU (``Process N has X
    GiB memory in use``, §6): the launch could not get memory a live process already held.
    Numbers: ``holder_pid`` and ``held_gib`` of the biggest holder, ``others_held_gib`` of all
    of them, ``free_gib``, ``gpu_total_gib``, ``tried_to_allocate_gib`` (GiB)."""
    found = _held_at_oom(bundle)
    return None if found is None else _held_at_oom_diagnosis(bundle, found)


def _held_at_oom_diagnosis(bundle: Bundle, found: HeldAtOom) -> Diagnosis:
    orphans = _live_orphans(found.holders)
    pid, used = found.biggest
    evidence = [bundle.evidence(found.hit)]
    for h in found.holders[:4]:
        fact = f"PID {h.pid} ({h.name}) PPID {h.ppid} state {h.state} on GPU {h.gpu}"
        evidence.append(Evidence(fact, None, "snapshot"))
    return Diagnosis(
        category="gpu-occupied-by-other-process",
        secondary_categories=["defunct-zombie-process"] if orphans else [],
        summary=(
            f"{bundle.gpu_named(found.gpu)} is occupied by {_others_text(found)} of its "
            f"{found.total:.2f} GiB, "
            f"so only {found.free:.2f} GiB was free and this launch ran out of memory"
            f"{' while loading the weights' if found.while_loading else ''} (allocating "
            f"{found.tried:.2f} GiB){_orphan_text(orphans)}"
        ),
        remedy=_held_at_oom_remedy(found, bool(orphans)),
        evidence=evidence,
        numbers={
            "gpu": found.gpu,
            "holder_pid": pid,
            "held_gib": round(used, 2),
            "others_held_gib": round(found.held, 2),
            "free_gib": round(found.free, 2),
            "gpu_total_gib": round(found.total, 2),
            "tried_to_allocate_gib": round(found.tried, 2),
            **_orphan_numbers(orphans),
        },
    )


def _others_text(found: HeldAtOom) -> str:
    """Who holds the GPU: ``another process: PID …`` or ``N other processes: …``."""
    if len(found.others) == 1:
        pid, used = found.biggest
        return f"another process: PID {pid} holds {used:.2f} GiB"
    each = ", ".join(f"PID {p} {u:.2f} GiB" for p, u in found.others)
    return f"{len(found.others)} other processes: {each}, together {found.held:.2f} GiB"


def _held_at_oom_remedy(found: HeldAtOom, orphans: bool) -> str:
    if orphans:
        return (
            "kill orphaned sglang::scheduler processes (kill -TERM, after 10 s kill -KILL: "
            f"PIDs {', '.join(str(h.pid) for h in found.holders if h.orphan)}) and verify "
            "nvidia-smi compute apps empty before relaunching; add a pre-launch GPU idle check, "
            "and launch each server in its own session so cleanup can kill by process "
            "group/session (under Slurm, let the job's cgroup / KillMode take the whole tree)"
        )
    pids = ", ".join(str(p) for p, _ in found.others)
    return (
        f"stop the process{'es' if len(found.others) > 1 else ''} holding GPU {found.gpu} "
        f"(PID {pids}) or launch on idle GPUs (CUDA_VISIBLE_DEVICES); add a pre-launch GPU idle "
        "check (nvidia-smi --query-compute-apps=pid,used_memory must be empty)"
    )


SMI_ROW = re.compile(
    r"(?:^\|\s*(?P<gpu>\d+)\s[^|]*)?\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|\s*"
    r"(?P<util>\d+)%"
)


COMPUTE_APP = re.compile(r"^\s*(?P<pid>\d+), (?P<used>\d+) MiB\s*$")


FUSER = re.compile(
    r"/dev/nvidia(?P<gpu>\d+):\s+(?P<user>\S+)\s+(?P<pid>\d+)\s+\S+\s+(?P<command>\S+)"
)


NO_PROCESSES = re.compile(r"No running processes found")


NO_SUCH_PROCESS = re.compile(r"\(?(?P<pid>\d+)\)? - No such process")


NSPID = re.compile(r"NSpid:\s+(?P<host>\d+)\s+(?P<inner>\d+)")


CONTAINER = re.compile(r"docker-(?P<id>[0-9a-f]{12})[0-9a-f]*\.scope")


@dataclass(frozen=True)
class HiddenHolder:
    """A live process holding memory on GPU ``gpu`` while nvidia-smi output in the log shows it
    in use (``shown``, the first such line): PID, command and MiB held (``None``: not said),
    the nvidia-smi row of that GPU, and the log's signs of another PID namespace."""

    shown: Hit
    pid: int
    gpu: int | None
    command: str
    mib: int | None
    row: re.Match[str] | None
    hidden: Hit | None
    nspid: Hit | None
    container: Hit | None
    fuser: Hit | None


def _hidden_holder(bundle: Bundle) -> HiddenHolder | None:
    shown = bundle.log.find(SMI_ROW) + bundle.log.find(COMPUTE_APP)
    fuser = bundle.log.first(FUSER)
    live = [h for h in _gpu_holders(bundle) if h.alive and h.gpu is not None]
    if not shown or not (live or fuser):
        return None
    pid, gpu, command, mib = _holder_of(live, fuser)
    rows = [m for _, m in bundle.log.find(SMI_ROW) if m["gpu"] is None or int(m["gpu"]) == gpu]
    if mib is None and rows:
        mib = int(rows[0]["used"])
    return HiddenHolder(
        shown[0],
        pid,
        gpu,
        command,
        mib,
        row=rows[0] if rows else None,
        hidden=bundle.log.first(NO_PROCESSES) or bundle.log.first(NO_SUCH_PROCESS),
        nspid=bundle.log.first(NSPID),
        container=bundle.log.first(CONTAINER),
        fuser=fuser,
    )


def _holder_of(live: list[Holder], fuser: Hit | None) -> tuple[int, int | None, str, int | None]:
    """(PID, GPU, command, MiB or ``None``) of the first live holder, else of fuser's line."""
    if live:
        holder = live[0]
        mib = round(holder.used_bytes / 2**20) if holder.used_bytes else None
        return holder.pid, holder.gpu, holder.name, mib
    assert fuser is not None
    return int(fuser[1]["pid"]), int(fuser[1]["gpu"]), fuser[1]["command"], None


def gpu_held_hidden(bundle: Bundle) -> Diagnosis | None:
    """nvidia-smi output in the log shows GPU memory in use and a live process holds it (the
    snapshot's ``ps``, or ``fuser -v /dev/nvidiaN``): occupied, not leaked (FORMAT.md). From
    inside a container nvidia-smi cannot name a host PID ("No running processes found") and
    ``kill`` answers "No such process": the holder is in another PID namespace."""
    found = _hidden_holder(bundle)
    return None if found is None else _hidden_holder_diagnosis(bundle, found)


def _hidden_holder_diagnosis(bundle: Bundle, found: HiddenHolder) -> Diagnosis:
    numbers: dict[str, float] = {"gpu_index": int(found.gpu or 0), "holder_pid": found.pid}
    if found.mib is not None:
        numbers["held_mib"] = found.mib
    if found.row is not None:
        numbers["util_percent"] = int(found.row["util"])
    hits = (found.shown, found.hidden, found.container, found.fuser)
    stop = ""
    if found.container is not None:
        stop = f"docker stop {found.container[1]['id']} (the container that owns it), or "
    return Diagnosis(
        category="gpu-occupied-by-other-process",
        summary=_hidden_holder_summary(found),
        remedy=(
            "run cleanup on the host as root: fuser -v /dev/nvidia* (or lsof /dev/nvidia*) names "
            f"the holders; {stop}kill the host PID from the host (kill -TERM {found.pid}, then "
            "-KILL), then check that the memory is free; do the pre-launch GPU idle check from "
            "the host"
        ),
        evidence=[bundle.evidence(hit) for hit in hits if hit is not None],
        numbers=numbers,
    )


def _hidden_holder_summary(found: HiddenHolder) -> str:
    util = f" at {found.row['util']}% util" if found.row is not None else ""
    summary = (
        f"GPU {found.gpu} is occupied by a live process: PID {found.pid} "
        f"({found.command or '?'}) holds {found.mib if found.mib is not None else '?'} MiB{util}"
    )
    if found.hidden is not None:
        summary += (
            "; inside the launch container nvidia-smi lists no running process and kill answers "
            "'No such process', because the holder lives in another PID namespace"
        )
    if found.nspid is not None:
        summary += f" (PID {found.nspid[1]['inner']} there)"
    if found.container is not None:
        summary += f", in Docker container {found.container[1]['id']}"
    if found.fuser is not None:
        fuser = found.fuser[1]
        summary += f"; fuser on /dev/nvidia{fuser['gpu']} shows it (user {fuser['user']})"
    return summary


@dataclass(frozen=True)
class CleanupLeak:
    """The latest snapshot, taken after a cleanup, shows GPU memory used with no process:
    ``gpus`` (their indexes as facts.json has them) and MiB each (``used_mib`` by index as text;
    of a repeated index the last), the host RAM still in use and what did not come back since
    before the launch (GB, ``None`` when unknown), and the snapshot's notes."""

    gpus: tuple[object, ...]
    used_mib: Mapping[str, int]
    host_in_use_gb: float | None
    host_leaked_gb: float | None
    notes: tuple[str, ...]


def cleanup_leak(bundle: Bundle) -> CleanupLeak | None:
    """The leak after a cleanup (FORMAT.md: the latest snapshot sets the question), or ``None``
    when the latest snapshot is not after a cleanup or no GPU holds more than 1 GiB unowned."""
    snapshots = bundle.facts.get("snapshots") or []
    if not snapshots or snapshots[-1].get("phase") != "after_cleanup":
        return None
    last = snapshots[-1]
    owned = {p.get("gpu_index") for p in last.get("gpu_processes") or []}
    held = [
        g
        for g in last.get("gpus") or []
        if (g.get("memory_used_bytes") or 0) > 2**30 and g.get("index") not in owned
    ]
    if not held:
        return None
    used_mib = {str(g["index"]): round(g["memory_used_bytes"] / 2**20) for g in held}
    in_use, leaked = _host_after_cleanup(bundle, last.get("meminfo") or {})
    notes = tuple(str(n) for n in last.get("notes") or [])
    return CleanupLeak(tuple(g["index"] for g in held), used_mib, in_use, leaked, notes)


def _host_after_cleanup(
    bundle: Bundle, meminfo: Mapping[str, Any]
) -> tuple[float | None, float | None]:
    """GB of host RAM in use after the cleanup, and how much less is available than before the
    launch; ``None`` for what the snapshots do not say."""
    before = _available_before(bundle)
    if not (meminfo.get("MemTotal") and meminfo.get("MemAvailable") is not None):
        return None, None
    in_use = (meminfo["MemTotal"] - meminfo["MemAvailable"]) / 1e9
    leaked = before - meminfo["MemAvailable"] / 1e9 if before is not None else None
    return in_use, leaked


def leak_diagnosis(leak: CleanupLeak, earlier: Diagnosis) -> Diagnosis:
    """``leak`` in words, with ``earlier``, the diagnosis of the launch before the cleanup (its
    category is named unless ``unknown``)."""
    numbers: dict[str, float] = {f"gpu{key}_used_mib": mib for key, mib in leak.used_mib.items()}
    host = ""
    if leak.host_in_use_gb is not None:
        numbers["host_used_after_cleanup_gb"] = round(leak.host_in_use_gb)
        host = f" and {leak.host_in_use_gb:.0f} GB of host RAM stays in use"
        if leak.host_leaked_gb is not None:
            numbers["leaked_host_gb"] = round(leak.host_leaked_gb)
            host += f" ({leak.host_leaked_gb:.0f} GB more than before the launch)"
    gpus = " and ".join(str(index) for index in leak.gpus)
    used = " and ".join(f"{leak.used_mib[str(index)]:g}" for index in leak.gpus)
    known = earlier.category != "unknown"
    cause = f"; the launch itself failed as {earlier.category}" if known else ""
    return Diagnosis(
        category="leaked-gpu-memory",
        secondary_categories=[earlier.category] if known else [],
        summary=(
            f"after cleanup GPU {gpus} still show {used} MiB used{host} with no owning "
            f"process{cause}"
        ),
        remedy=(
            "no owning process is left to kill: try a GPU reset (nvidia-smi --gpu-reset) where "
            "supported, else drain and reboot the node (or reload the driver)"
        ),
        evidence=[Evidence(note, None, "snapshot") for note in leak.notes[:4]],
        numbers=numbers,
    )


@dataclass(frozen=True)
class Survivor:
    """A process of the launch left after its cleanup: PID, title, state, parent, and the GPU
    memory it holds (GiB by GPU index, from the snapshot's gpu_processes)."""

    pid: int
    name: str
    state: str
    ppid: int | None
    held_gib: Mapping[int, float]


#: What a survivor's state says, in words.
STATES = {"D": "uninterruptible (D, stuck in the kernel)", "Z": "defunct (Z)"}


def cleanup_survivors(bundle: Bundle) -> list[Survivor] | None:
    """The launch's processes the latest snapshot, taken after a cleanup, still lists in state
    ``D`` or ``Z`` or re-parented to PID 1 (its ``processes`` are the launch's, FORMAT.md);
    ``None`` when the latest snapshot is not after a cleanup or lists none."""
    snapshots = bundle.facts.get("snapshots") or []
    if not snapshots or snapshots[-1].get("phase") != "after_cleanup":
        return None
    last = snapshots[-1]
    held: dict[int, dict[int, float]] = {}
    for row in last.get("gpu_processes") or []:
        if row.get("pid") is not None and row.get("used_memory_bytes"):
            held.setdefault(row["pid"], {})[int(row.get("gpu_index") or 0)] = round(
                row["used_memory_bytes"] / 2**30, 2
            )
    found = [
        Survivor(
            int(p["pid"]),
            str(p.get("cmdline") or p.get("name") or "?"),
            str(p.get("state") or "?"),
            p.get("ppid"),
            held.get(p["pid"], {}),
        )
        for p in last.get("processes") or []
        if p.get("pid") is not None
        and (str(p.get("state") or "")[:1] in STATES or p.get("ppid") == 1)
    ]
    return found or None


def survivors_diagnosis(bundle: Bundle, survivors: list[Survivor], earlier: Diagnosis) -> Diagnosis:
    """The survivors in words (what each holds), with ``earlier``, the launch's own failure."""
    last = bundle.snapshots()[-1]
    used = {g.get("index"): g.get("memory_used_bytes") for g in last.get("gpus") or []}
    numbers: dict[str, float] = {}
    parts = []
    for s in survivors[:4]:
        state = STATES.get(s.state[:1], f"state {s.state}")
        text = f"PID {s.pid} ({s.name}) is still alive, {state}"
        if s.ppid == 1:
            text += ", re-parented to PID 1"
        for gpu, gib in s.held_gib.items():
            numbers[f"held_gib_gpu{gpu}"] = gib
            text += f", holding {gib:.2f} GiB of GPU {gpu}"
            if isinstance(used.get(gpu), int):
                numbers[f"gpu{gpu}_used_gib"] = round(used[gpu] / 2**30, 2)
                text += f" ({used[gpu] / 2**30:.2f} GiB used on it)"
        numbers.setdefault("stuck_pid", s.pid)
        parts.append(text)
    pinned = ""
    if any(s.state.startswith("D") for s in survivors) and bundle.flag("enable_hierarchical_cache"):
        size = bundle.number("hicache_size")
        if size:
            numbers["hicache_gb"] = size
            pinned = f"; a D-state rank is the kernel unpinning its {size:g} GB HiCache host pool"
    known = earlier.category != "unknown"
    cause = f"; the launch itself failed as {earlier.category}: {earlier.summary}" if known else ""
    numbers.update({k: v for k, v in earlier.numbers.items() if k not in numbers})
    return Diagnosis(
        category="defunct-zombie-process",
        secondary_categories=[earlier.category] if known else [],
        summary="after cleanup " + "; ".join(parts) + pinned + cause,
        remedy=(
            "wait until the kernel finishes unpinning (a D-state process cannot be killed), "
            "do not relaunch until the GPU is idle; stop with SIGTERM before SIGKILL so a "
            "graceful shutdown releases the pinned host pool; reboot if it stays in D state; "
            "a defunct process goes when its parent reaps it or is killed"
        ),
        evidence=[Evidence(n, None, "snapshot") for n in (last.get("notes") or [])[:4]],
        numbers=numbers,
    )
