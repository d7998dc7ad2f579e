"""The node's memory ledger: who holds how much host RAM and GPU memory, and what the kernel says.

Each process that takes memory keeps one JSON file ``ledger/<pid>.json``; a process that dies
without releasing frees its memory, except under the ``leak-on-crash`` fault when it was killed by
a dying server (the entry moves to ``leaked/`` and stays until reboot) or by the OOM killer (its
GPU memory stays in ``leaked/``; the kernel takes its host pages back). ``/proc/meminfo`` inside the
node is a bind mount of ``meminfo``, regenerated in place whenever the ledger changes, the way LXCFS
presents a container's memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

ROOT = os.environ.get("SIMNODE_ROOT", "/run/simfleet")
KiB = 1024
GiB = 2**30

_config: dict[str, Any] | None = None


def path(*parts: str) -> str:
    return os.path.join(ROOT, *parts)


def config() -> dict[str, Any]:
    """The node's settings (node.json): GPUs, RAM, faults, SGLang version, speed."""
    global _config
    if _config is None:
        with open(path("node.json")) as handle:
            _config = json.load(handle)
    return _config


def has_fault(name: str) -> bool:
    return name in config().get("faults", [])


def speed() -> float:
    return float(config().get("speed", 1.0)) or 1.0


_lock_depth = 0


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Serialise ledger changes node-wide (every writer runs inside the node).

    Re-entrant within a process: a signal handler that releases memory while the interrupted
    code holds the lock must not wait on itself.
    """
    global _lock_depth
    if _lock_depth:
        _lock_depth += 1
        try:
            yield
        finally:
            _lock_depth -= 1
        return
    with open(path("ledger.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _lock_depth = 1
        try:
            yield
        finally:
            _lock_depth = 0
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- processes -------------------------------------------------------------------------------


def proc_state(pid: int) -> tuple[str, int] | None:
    """``(state letter, start time in clock ticks)`` of a live process, else None."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def alive(pid: int, start: int | None = None) -> bool:
    """True for a running (not zombie) process, with the same start time if one is given."""
    state = proc_state(pid)
    if state is None or state[0] in ("Z", "X"):
        return False
    return start is None or state[1] == start


def cmdline_name(pid: int) -> str:
    """What ``nvidia-smi`` shows as the process name: argv[0] (a process title if one is set)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return ""
    return raw.split(b"\0")[0].decode(errors="replace")


def set_title(title: str) -> None:
    """Set this process's title the way setproctitle does: comm and the whole command line."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    try:
        with open("/proc/self/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        # fields[0] is field 3 of stat; arg_start/arg_end are fields 48 and 49.
        arg_start, arg_end = int(fields[45]), int(fields[46])
        data = title.encode()[: arg_end - arg_start - 1]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(arg_start)
            mem.write(data + b"\0" * (arg_end - arg_start - len(data)))
    except (OSError, ValueError, IndexError):
        pass


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Signal this process when its parent dies, as every SGLang child does (PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, sig, 0, 0, 0)


def freeze_self() -> None:
    """Enter uninterruptible sleep (D) for good, holding all memory, like a task stuck unpinning
    a huge registered buffer while being killed. Only a reboot (which thaws) ends it."""
    group = f"/run/.freezer/{config()['freezer_cgroup']}"
    with open(f"{group}/cgroup.procs", "w") as handle:
        handle.write(str(os.getpid()))
    with open(f"{group}/freezer.state", "w") as handle:
        handle.write("FROZEN")
    while True:
        time.sleep(1)


# --- the ledger ------------------------------------------------------------------------------


def _entry_path(pid: int) -> str:
    return path("ledger", f"{pid}.json")


def _write_json(target: str, data: dict[str, Any]) -> None:
    tmp = f"{target}.{os.getpid()}.tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle)
    os.replace(tmp, target)


def _read_json(target: str) -> dict[str, Any] | None:
    try:
        with open(target) as handle:
            data: dict[str, Any] = json.load(handle)
            return data
    except (FileNotFoundError, json.JSONDecodeError):
        return None


_registered_exit = False


def my_entry() -> dict[str, Any]:
    global _registered_exit
    pid = os.getpid()
    if not _registered_exit:
        # A normal exit gives memory back at once, as the kernel does at process exit.
        import atexit

        atexit.register(release_mine)
        _registered_exit = True
    entry = _read_json(_entry_path(pid))
    if entry is None:
        state = proc_state(pid)
        entry = {
            "pid": pid,
            "start": state[1] if state else 0,
            "name": cmdline_name(pid),
            "host_bytes": 0,
            "gpu": {},
        }
    return entry


def entries() -> list[dict[str, Any]]:
    """Ledger entries of live processes; dead owners are settled on the way (freed or leaked)."""
    live = []
    folder = path("ledger")
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        entry = _read_json(os.path.join(folder, name))
        if entry is None:
            continue
        if alive(entry["pid"], entry.get("start")):
            live.append(entry)
        else:
            _settle(entry)
    return live


def _settle(entry: dict[str, Any]) -> None:
    source = _entry_path(entry["pid"])
    if entry.get("leak") and has_fault("leak-on-crash"):
        with contextlib.suppress(FileNotFoundError):
            os.replace(source, path("leaked", f"{entry['pid']}-{entry.get('start', 0)}.json"))
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(source)


def leaked() -> list[dict[str, Any]]:
    """Memory still held with no process (leak-on-crash), until reboot or GPU reset."""
    folder = path("leaked")
    found = []
    for name in sorted(os.listdir(folder)):
        entry = _read_json(os.path.join(folder, name))
        if entry is not None:
            found.append(entry)
    return found


def update_mine(**changes: Any) -> None:
    """Change this process's entry (``host_bytes``, ``gpu``, ``name``, ``leak``) and republish."""
    with locked():
        entry = my_entry()
        entry.update(changes)
        _write_json(_entry_path(os.getpid()), entry)
        publish()


def add_gpu_bytes(index: int, size: int) -> None:
    with locked():
        entry = my_entry()
        gpu = entry.setdefault("gpu", {})
        gpu[str(index)] = gpu.get(str(index), 0) + size
        _write_json(_entry_path(os.getpid()), entry)
        publish()


def release_mine() -> None:
    """A clean exit: everything this process held is freed."""
    if not os.path.exists(_entry_path(os.getpid())):
        return
    with locked():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_entry_path(os.getpid()))
        publish()


# --- totals ----------------------------------------------------------------------------------


def shm_used_bytes() -> int:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def host_used_bytes(live: list[dict[str, Any]] | None = None) -> int:
    """Base OS use + pinned by live processes + leaked + /dev/shm contents, in bytes."""
    live = entries() if live is None else live
    held = sum(e.get("host_bytes", 0) for e in live) + sum(e.get("host_bytes", 0) for e in leaked())
    return int(config()["base_used_bytes"]) + held + shm_used_bytes()


def pin_host(size: int, chunks: int = 8, pause: float = 0.0) -> None:
    """Pin ``size`` more bytes of host RAM in ``chunks`` steps, as cudaHostRegister faults pages.

    Before each step the simulated kernel checks the node: when the step would exceed MemTotal
    (or the cgroup limit), the OOM killer SIGKILLs the process holding the most memory, which may
    be this one.
    """
    step = size // chunks
    for i in range(chunks):
        grant = size - step * (chunks - 1) if i == chunks - 1 else step
        with locked():
            live = entries()
            limit = memory_limit()
            while host_used_bytes(live) + grant > limit:
                victim = _oom_victim(live)
                if victim is None:
                    break
                _oom_kill(victim)
                live = [e for e in live if e["pid"] != victim["pid"]]
            entry = my_entry()
            entry["host_bytes"] = entry.get("host_bytes", 0) + grant
            entry["pin_step"] = step
            _write_json(_entry_path(os.getpid()), entry)
            publish()
        if pause:
            time.sleep(pause)


def memory_limit() -> int:
    total = int(config()["host_ram_bytes"])
    cgroup = config().get("cgroup_limit_bytes")
    return min(total, int(cgroup)) if cgroup else total


def _oom_victim(live: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Like Linux's select_bad_process: the largest wins; on a tie the later task does.

    Processes pinning side by side (TP ranks faulting in their pools together) drift apart by
    scheduling noise; sizes within a quarter of the largest count as tied, so which rank goes
    does not depend on that noise.
    """
    largest = max((e.get("host_bytes", 0) for e in live), default=0)
    if largest <= 0:
        return None
    tied = [e for e in live if e.get("host_bytes", 0) >= largest * 3 // 4]
    return max(tied, key=lambda e: e["pid"])


def _oom_kill(victim: dict[str, Any]) -> None:
    pid = victim["pid"]
    comm = _comm(pid)
    rss_kb = victim.get("host_bytes", 0) // KiB
    kernel_log(
        f"{comm} invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), "
        "order=0, oom_score_adj=0"
    )
    kernel_log(
        f"Out of memory: Killed process {pid} ({comm}) total-vm:{rss_kb + 41_943_040}kB, "
        f"anon-rss:{rss_kb}kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:{rss_kb // 512}kB "
        "oom_score_adj:0"
    )
    # The kernel takes the host memory back from an OOM-killed process, leak fault or not. Under
    # the fault the driver cannot tear down the dead rank's CUDA context, so its device memory
    # stays held with no process: the incident's two GPUs (~96 GB each) after every process was
    # gone. This is the rank's own death path, not only a SIGKILL from outside.
    if victim.get("leak") and has_fault("leak-on-crash") and victim.get("gpu"):
        _write_json(
            path("leaked", f"{pid}-{victim.get('start', 0)}.json"), {**victim, "host_bytes": 0}
        )
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_entry_path(pid))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return "?"


# --- what the node shows -----------------------------------------------------------------------

_MEMINFO_KEYS = (
    "MemTotal",
    "MemFree",
    "MemAvailable",
    "Buffers",
    "Cached",
    "SwapCached",
    "Active",
    "Inactive",
    "Unevictable",
    "Mlocked",
    "SwapTotal",
    "SwapFree",
    "Dirty",
    "Writeback",
    "AnonPages",
    "Mapped",
    "Shmem",
    "KReclaimable",
    "Slab",
    "SReclaimable",
    "SUnreclaim",
    "KernelStack",
    "PageTables",
    "CommitLimit",
    "Committed_AS",
    "VmallocTotal",
    "VmallocUsed",
    "HugePages_Total",
    "HugePages_Free",
    "HugePages_Rsvd",
    "HugePages_Surp",
    "Hugepagesize",
    "Hugetlb",
)


def render_meminfo(live: list[dict[str, Any]] | None = None) -> str:
    """``/proc/meminfo`` text for the node; every line has a fixed width so rewrites keep size."""
    live = entries() if live is None else live
    total = int(config()["host_ram_bytes"])
    pinned = sum(e.get("host_bytes", 0) for e in live) + sum(
        e.get("host_bytes", 0) for e in leaked()
    )
    shm = shm_used_bytes()
    used = int(config()["base_used_bytes"]) + pinned + shm
    available = max(0, total - used)
    cached = min(available // 10, 8 * GiB)
    values = dict.fromkeys(_MEMINFO_KEYS, 0)
    values.update(
        MemTotal=total,
        MemFree=max(0, available - cached),
        MemAvailable=available,
        Cached=cached + shm,
        Active=used,
        Unevictable=pinned,
        Mlocked=pinned,
        AnonPages=used - shm,
        Shmem=shm,
        CommitLimit=total // 2,
        Committed_AS=used,
        VmallocTotal=34359738367 * KiB,
        Hugepagesize=2048 * KiB,
    )
    lines = []
    for key in _MEMINFO_KEYS:
        value = values[key]
        if key.startswith("HugePages_"):
            lines.append(f"{key + ':':<16}{value:>16}   \n")
        else:
            lines.append(f"{key + ':':<16}{value // KiB:>16} kB\n")
    return "".join(lines)


def publish(live: list[dict[str, Any]] | None = None) -> None:
    """Rewrite meminfo and the cgroup files in place (the bind mounts pin their inodes)."""
    live = entries() if live is None else live
    _rewrite(path("meminfo"), render_meminfo(live))
    limit = config().get("cgroup_limit_bytes")
    _rewrite(path("cgroup", "memory.max"), f"{limit if limit else 'max':<24}\n")
    _rewrite(path("cgroup", "memory.current"), f"{host_used_bytes(live):<24}\n")


def _rewrite(target: str, text: str) -> None:
    data = text.encode()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def kernel_log(message: str) -> None:
    """Append a line to the node's kernel ring buffer, stamped with seconds since boot."""
    since_boot = time.time() - float(config()["boot_time"])
    with open(path("kmsg"), "a") as handle:
        handle.write(f"{since_boot:.6f} {message}\n")
