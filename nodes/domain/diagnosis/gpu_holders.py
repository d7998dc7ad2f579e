"""Rules for GPU memory that someone else holds: another process (seen by SGLang's balance check,
named in PyTorch's OOM text, or hidden in another PID namespace), or nobody (leaked after a
cleanup)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodes.domain.diagnosis.evidence import LOAD_BEGIN, LOAD_END, Bundle, Diagnosis, Evidence, _num
from nodes.domain.diagnosis.host_pools import _available_before

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


# PyTorch's allocator text (c10/cuda/CUDACachingAllocator.cpp) since 2.1: the sizes go through
# format_size (bytes, KiB, MiB, GiB), 2.1 spelled "capacty", and the "Process N has" entries come
# in NVML's order, this process's own ("Including non-PyTorch memory, this process has") among
# them.
_SIZE = r"[\d.]+ (?:bytes|[KMGT]iB)"
OOM_WITH_HOLDER = re.compile(
    rf"CUDA out of memory\. Tried to allocate (?P<tried>{_SIZE})\. GPU (?P<gpu>\d+) has a total "
    rf"capaci?ty of (?P<total>{_SIZE}) of which (?P<free>{_SIZE}) is free\. "
    rf"(?P<processes>(?:(?:Including non-PyTorch memory, this process|Process \d+) has {_SIZE} "
    r"memory in use\. ?)*Process \d+ has .*)"
)
OTHER_PROCESS = re.compile(rf"\bProcess (?P<pid>\d+) has (?P<used>{_SIZE}) memory in use")
_UNITS = {"bytes": 2**-30, "KiB": 2**-20, "MiB": 2**-10, "GiB": 1.0, "TiB": 2**10}


def _gib(size: str) -> float:
    """``"512.00 MiB"`` → 0.5 (GiB)."""
    value, unit = size.split()
    return _num(value) * _UNITS[unit]


# The same allocator's text before PyTorch 2.1: no list of processes, only this process's own
# figures, the free memory and the sizes in format_size's units ("0 bytes free"); with a memory
# fraction set it adds "N allowed".
OOM_BEFORE_2_1 = re.compile(
    rf"CUDA out of memory\. Tried to allocate (?P<tried>{_SIZE}) \(GPU (?P<gpu>\d+); "
    rf"(?P<total>{_SIZE}) total capacity; (?P<allocated>{_SIZE}) already allocated; "
    rf"(?P<free>{_SIZE}) free; (?:{_SIZE} allowed; )?(?P<reserved>{_SIZE}) reserved in total "
    r"by PyTorch\)"
)
#: Memory on the card outside this process's PyTorch that is still this process's own (the CUDA
#: context, NCCL's and cuBLAS's buffers) stays below this share of the card, and below
#: ``OUTSIDE_MIN_GIB``; more than both is another holder's.
OUTSIDE_SHARE = 0.10
OUTSIDE_MIN_GIB = 4.0


def oom_figures(match: re.Match[str]) -> dict[str, float]:
    """The sizes of an ``OOM_BEFORE_2_1`` match in GiB: ``tried``, ``total``, ``allocated``,
    ``free``, ``reserved``, and ``outside`` = total − free − reserved (what neither PyTorch in
    this process reserved nor is free)."""
    figures = {k: _gib(match[k]) for k in ("tried", "total", "allocated", "free", "reserved")}
    figures["outside"] = max(figures["total"] - figures["free"] - figures["reserved"], 0.0)
    return figures


def gpu_held_outside_at_oom(bundle: Bundle) -> Diagnosis | None:
    """PyTorch before 2.1 names no other process in its OOM text, but says how much of the card
    is free and how much this process's PyTorch reserved: the rest (total − free − reserved) is
    held by something else, another process or memory of this one outside PyTorch. More than
    ``OUTSIDE_MIN_GIB`` and ``OUTSIDE_SHARE`` of the card is more than a CUDA context and
    NCCL's buffers: another holder. Numbers in GiB: ``others_held_gib``, ``free_gib``,
    ``reserved_gib``, ``allocated_gib``, ``gpu_total_gib``, ``tried_to_allocate_gib``; ``gpu``."""
    hit = bundle.log.first(OOM_BEFORE_2_1)
    if hit is None:
        return None
    figures, gpu = oom_figures(hit[1]), int(hit[1]["gpu"])
    total, outside = figures["total"], figures["outside"]
    if outside <= max(OUTSIDE_MIN_GIB, OUTSIDE_SHARE * total):
        return None
    begin, end = bundle.log.first(LOAD_BEGIN), bundle.log.first(LOAD_END)
    when = " while loading the weights" if begin and (end is None or end[0] > hit[0]) else ""
    return Diagnosis(
        category="gpu-occupied-by-other-process",
        summary=(
            f"GPU {gpu} is occupied outside this launch: of its {total:.2f} GiB only "
            f"{figures['free']:.2f} GiB was free and this process's PyTorch reserved "
            f"{figures['reserved']:.2f} GiB, so {outside:.2f} GiB is held by another process "
            f"(or outside PyTorch); this launch ran out of memory{when} (allocating "
            f"{figures['tried']:.2f} GiB)"
        ),
        remedy=(
            f"find what holds GPU {gpu} (nvidia-smi --query-compute-apps=pid,used_memory, or the "
            "node's GPU holders) and stop it, or launch on idle GPUs (CUDA_VISIBLE_DEVICES); add "
            "a pre-launch GPU idle check"
        ),
        evidence=[bundle.evidence(hit)],
        numbers={
            "gpu": gpu,
            "others_held_gib": round(outside, 2),
            "free_gib": round(figures["free"], 2),
            "reserved_gib": round(figures["reserved"], 2),
            "allocated_gib": round(figures["allocated"], 2),
            "gpu_total_gib": round(total, 2),
            "tried_to_allocate_gib": round(figures["tried"], 2),
        },
    )


def _orphans(holders: list[Holder]) -> tuple[str, dict[str, float]]:
    """The live orphaned server processes among ``holders``, in words and figures."""
    orphans = [h for h in holders if h.alive and h.orphan]
    if not orphans:
        return "", {}
    mib = [round((h.used_bytes or 0) / 2**20) for h in orphans]
    gpus = sorted({h.gpu for h in orphans if h.gpu is not None})
    numbers: dict[str, float] = {"orphans": len(orphans), "orphan_ppid": 1}
    for holder, each in zip(orphans, mib, strict=True):
        numbers[f"orphan_{holder.pid}_mib"] = each
    text = (
        f"; the node shows {len(orphans)} live server processes re-parented to PPID 1 "
        f"({', '.join(h.name for h in orphans[:4])}) holding {', '.join(map(str, mib))} MiB"
        + (f" on GPUs {', '.join(map(str, gpus))}" if gpus else "")
        + ", left over from an earlier launch"
    )
    return text, numbers


def gpu_held_at_oom(bundle: Bundle) -> Diagnosis | None:
    """PyTorch's OOM text names other processes holding memory on the GPU (``Process N has X
    GiB memory in use``, §6): the launch could not get memory a live process already held.
    Numbers: ``holder_pid`` and ``held_gib`` of the biggest holder, ``others_held_gib`` of all
    of them, ``free_gib``, ``gpu_total_gib``, ``tried_to_allocate_gib`` (GiB)."""
    hit = bundle.log.first(OOM_WITH_HOLDER)
    if hit is None:
        return None
    match = hit[1]
    others = [(int(m["pid"]), _gib(m["used"])) for m in OTHER_PROCESS.finditer(match["processes"])]
    if not others:
        return None
    gpu, total = int(match["gpu"]), _gib(match["total"])
    free, tried = _gib(match["free"]), _gib(match["tried"])
    pid, used = max(others, key=lambda other: other[1])
    held = sum(each for _, each in others)
    numbers: dict[str, float] = {
        "gpu": gpu,
        "holder_pid": pid,
        "held_gib": round(used, 2),
        "others_held_gib": round(held, 2),
        "free_gib": round(free, 2),
        "gpu_total_gib": round(total, 2),
        "tried_to_allocate_gib": round(tried, 2),
    }
    begin, end = bundle.log.first(LOAD_BEGIN), bundle.log.first(LOAD_END)
    when = " while loading the weights" if begin and (end is None or end[0] > hit[0]) else ""
    holders = _gpu_holders(bundle)
    orphans, figures = _orphans(holders)
    numbers.update(figures)
    evidence = [bundle.evidence(hit)]
    for h in holders[:4]:
        fact = f"PID {h.pid} ({h.name}) PPID {h.ppid} state {h.state} on GPU {h.gpu}"
        evidence.append(Evidence(fact, None, "snapshot"))
    pids = ", ".join(str(p) for p, _ in others)
    if orphans:
        remedy = (
            "kill orphaned sglang::scheduler processes (kill -TERM, after 10 s kill -KILL: "
            f"PIDs {', '.join(str(h.pid) for h in holders if h.orphan)}) and verify nvidia-smi "
            "compute apps empty before relaunching; add a pre-launch GPU idle check, and launch "
            "each server in its own session so cleanup can kill by process group/session (under "
            "Slurm, let the job's cgroup / KillMode take the whole tree)"
        )
    else:
        remedy = (
            f"stop the process{'es' if len(others) > 1 else ''} holding GPU {gpu} (PID {pids}) "
            "or launch on idle GPUs (CUDA_VISIBLE_DEVICES); add a pre-launch GPU idle check "
            "(nvidia-smi --query-compute-apps=pid,used_memory must be empty)"
        )
    if len(others) == 1:
        who = f"another process: PID {pid} holds {used:.2f} GiB"
    else:
        each = ", ".join(f"PID {p} {u:.2f} GiB" for p, u in others)
        who = f"{len(others)} other processes: {each}, together {held:.2f} GiB"
    return Diagnosis(
        category="gpu-occupied-by-other-process",
        secondary_categories=["defunct-zombie-process"] if orphans else [],
        summary=(
            f"GPU {gpu} is occupied by {who} of its {total:.2f} GiB, so only {free:.2f} GiB was "
            f"free and this launch ran out of memory{when} (allocating {tried:.2f} GiB){orphans}"
        ),
        remedy=remedy,
        evidence=evidence,
        numbers=numbers,
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


def gpu_held_hidden(bundle: Bundle) -> Diagnosis | None:
    """nvidia-smi output in the log shows GPU memory in use and a live process holds it (the
    snapshot's ``ps``, or ``fuser -v /dev/nvidiaN``): occupied, not leaked (FORMAT.md). From
    inside a container nvidia-smi cannot name a host PID ("No running processes found") and
    ``kill`` answers "No such process": the holder is in another PID namespace."""
    shown = bundle.log.find(SMI_ROW) + bundle.log.find(COMPUTE_APP)
    fuser = bundle.log.first(FUSER)
    live = [h for h in _gpu_holders(bundle) if h.alive and h.gpu is not None]
    if not shown or not (live or fuser):
        return None
    if live:
        holder = live[0]
        pid, gpu, command = holder.pid, holder.gpu, holder.name
        mib = round(holder.used_bytes / 2**20) if holder.used_bytes else None
    else:
        assert fuser is not None
        pid, gpu, command = int(fuser[1]["pid"]), int(fuser[1]["gpu"]), fuser[1]["command"]
        mib = None
    rows = [m for _, m in bundle.log.find(SMI_ROW) if m["gpu"] is None or int(m["gpu"]) == gpu]
    numbers: dict[str, float] = {"gpu_index": int(gpu or 0), "holder_pid": pid}
    if mib is None and rows:
        mib = int(rows[0]["used"])
    if mib is not None:
        numbers["held_mib"] = mib
    util = ""
    if rows:
        numbers["util_percent"] = int(rows[0]["util"])
        util = f" at {rows[0]['util']}% util"
    summary = (
        f"GPU {gpu} is occupied by a live process: PID {pid} ({command or '?'}) holds "
        f"{mib if mib is not None else '?'} MiB{util}"
    )
    hidden = bundle.log.first(NO_PROCESSES) or bundle.log.first(NO_SUCH_PROCESS)
    nspid, container = bundle.log.first(NSPID), bundle.log.first(CONTAINER)
    evidence = [bundle.evidence(shown[0])]
    if hidden is not None:
        summary += (
            "; inside the launch container nvidia-smi lists no running process and kill answers "
            "'No such process', because the holder lives in another PID namespace"
        )
        evidence.append(bundle.evidence(hidden))
    if nspid is not None:
        summary += f" (PID {nspid[1]['inner']} there)"
    stop = ""
    if container is not None:
        summary += f", in Docker container {container[1]['id']}"
        stop = f"docker stop {container[1]['id']} (the container that owns it), or "
        evidence.append(bundle.evidence(container))
    if fuser is not None:
        summary += f"; fuser on /dev/nvidia{fuser[1]['gpu']} shows it (user {fuser[1]['user']})"
        evidence.append(bundle.evidence(fuser))
    return Diagnosis(
        category="gpu-occupied-by-other-process",
        summary=summary,
        remedy=(
            "run cleanup on the host as root: fuser -v /dev/nvidia* (or lsof /dev/nvidia*) names "
            f"the holders; {stop}kill the host PID from the host (kill -TERM {pid}, then -KILL), "
            "then check that the memory is free; do the pre-launch GPU idle check from the host"
        ),
        evidence=evidence,
        numbers=numbers,
    )


def leaked_after_cleanup(bundle: Bundle) -> Diagnosis | None:
    """The latest snapshot is after a cleanup (FORMAT.md: it sets the question): GPU memory used
    with no process, and host memory that did not come back."""
    snapshots = bundle.facts.get("snapshots") or []
    if not snapshots or snapshots[-1].get("phase") != "after_cleanup":
        return None
    last = snapshots[-1]
    holders = {p.get("gpu_index") for p in last.get("gpu_processes") or []}
    held = [
        g
        for g in last.get("gpus") or []
        if (g.get("memory_used_bytes") or 0) > 2**30 and g.get("index") not in holders
    ]
    if not held:
        return None
    numbers: dict[str, float] = {}
    for g in held:
        numbers[f"gpu{g['index']}_used_mib"] = round(g["memory_used_bytes"] / 2**20)
    gpus = " and ".join(str(g["index"]) for g in held)
    used = " and ".join(f"{numbers['gpu' + str(g['index']) + '_used_mib']:g}" for g in held)
    host = ""
    meminfo = last.get("meminfo") or {}
    before = _available_before(bundle)
    if meminfo.get("MemTotal") and meminfo.get("MemAvailable") is not None:
        in_use = (meminfo["MemTotal"] - meminfo["MemAvailable"]) / 1e9
        numbers["host_used_after_cleanup_gb"] = round(in_use)
        host = f" and {in_use:.0f} GB of host RAM stays in use"
        if before is not None:
            leaked = before - meminfo["MemAvailable"] / 1e9
            numbers["leaked_host_gb"] = round(leaked)
            host += f" ({leaked:.0f} GB more than before the launch)"
    # Imported here, not at the top: the engine imports this module for RULES, and this
    # rule asks the engine why the launch failed before the cleanup.
    from nodes.domain.diagnosis.engine import diagnose

    earlier = diagnose(
        "\n".join(bundle.log.lines), {**bundle.facts, "snapshots": snapshots[:-1]}, bundle.flags
    )
    cause = (
        f"; the launch itself failed as {earlier.category}" if earlier.category != "unknown" else ""
    )
    return Diagnosis(
        category="leaked-gpu-memory",
        secondary_categories=[earlier.category] if earlier.category != "unknown" else [],
        summary=(
            f"after cleanup GPU {gpus} still show {used} MiB used{host} with no owning "
            f"process{cause}"
        ),
        remedy=(
            "no owning process is left to kill: try a GPU reset (nvidia-smi --gpu-reset) where "
            "supported, else drain and reboot the node (or reload the driver)"
        ),
        evidence=[Evidence(str(n), None, "snapshot") for n in last.get("notes") or []][:4],
        numbers=numbers,
    )
