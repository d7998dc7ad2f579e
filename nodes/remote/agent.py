"""Rankwise's node agent: the one script the panel runs on a node, as
``python3 -c SOURCE COMMAND [ARGS…]`` over SSH (this file's source as one argument, so nothing
is installed on the node and stdin stays free for a request that holds secrets, which must not
show in the node's process list). Each command prints one JSON document on its last line of
output, except ``watch``, which prints one per change; ``nodes/remote/client.py`` reads them.

``python3 -c SOURCE --pynvml COMMAND …``: stdin carries the panel's copy of nvidia-ml-py's
``pynvml.py`` (``nodes/remote/shipped.py``), imported only when the node's Python has no
``pynvml`` of its own; every answer that read NVML says which module answered (``pynvml``).

Commands:
  probe [--live] PYTHON    GPUs (NVML, the ``pynvml`` module of nvidia-ml-py; ``nvidia-smi``
                           CSV when NVML is unusable), the PIDs' names, users and launches, the
                           launches with a process left (``live_launches``), /proc/meminfo; without
                           ``--live`` also the cgroup limit, /dev/shm, CPUs, OS, kernel and
                           ``PYTHON``'s SGLang version. Every failure is a reason in the answer.
  model DIR [STAMP]        DIR/config.json and the JSON header of every ``*.safetensors`` file
                           (never the tensors), grouped by name pattern; ``{"unchanged"}`` when
                           STAMP (total size, newest mtime) still holds; ``{"problem": WORD}``
  preflight MODEL PORT…    the ports among PORT… that something listens on, MODEL/config.json,
                           the size of /dev/shm
  start DIR PYTHON         start ``PYTHON -m sglang.launch_server`` from the JSON request on
                           stdin (``args``, ``env``, ``shown_command``, ``shown_env``,
                           ``launch_id``, ``run_as``) under a supervisor in its own session;
                           adopts instead when DIR/pid exists
  status DIR               pid, pgid, exit status, log size, members of the process group
  watch DIR INTERVAL BEAT  the status again whenever it changes (members, their states, the
                           exit), at least every BEAT s, every INTERVAL s once the group is
                           gone, with host memory and the GPUs' used memory (one NVML session);
                           members are re-read from the known PIDs and their children each
                           INTERVAL, the whole of /proc only every RESCAN_S
  stop DIR GRACE WAIT      SIGTERM the group, wait GRACE s, SIGKILL, wait WAIT s; what remains
  snapshot DIR             meminfo, the group's processes with states, kernel OOM lines,
                           listening ports, /dev/shm files
  holders [PGID…]          every process with /dev/nvidia* open (what ``fuser -v /dev/nvidia*``
                           reads, so holders NVML misses show too), every member of the given
                           groups, every process carrying a ``RANKWISE_LAUNCH_ID``; meminfo,
                           /dev/shm files, the launch folders under ~/.rankwise/launches
  signal SIG WAIT T…       send SIG (TERM, KILL) to each target (``PID@START``, ``PID`` or
                           ``-PGID``) that is still the process it names; what remains after
                           at most WAIT s (a process in D state is reported, not waited on)
  reap WAIT PID…           SIGCHLD the parents of defunct PIDs; what is still defunct
  reset INDEX              ``nvidia-smi --gpu-reset -i INDEX``: its exit status and exact words
  listen PORT SECONDS      bind a TCP listener on PORT (``0.0.0.0``, and ``::`` where IPv6 is
                           there), answer, then accept and close connections for SECONDS
                           (1..120) in a detached process: what another node's ``reach`` meets
  reach HOST PORT TIMEOUT  one TCP connect to HOST:PORT (an IPv4 or IPv6 address or a name)
                           within TIMEOUT s (0.1..60): reached or the OSError's words, and
                           how long it took

A launch's folder DIR (``~/.rankwise/launches/<id>-<token>``) holds what the panel needs to
re-adopt it after a restart of its own: ``command`` and ``env`` (secrets masked),
``launch_id``, ``pid``, ``pgid`` (the supervisor's session and group), ``server.log`` and, once
it ended, ``exit_status``. With ``run_as`` the supervisor (the SSH user, root) opens the log and
enters ``DIR/work`` before it drops to that user, so the control files stay out of its reach.

Standard library only, Python 3.7+: it runs on whatever ``python3`` the node has.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import platform
import pwd
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

SMI_GPU_FIELDS = "index,uuid,name,memory.total,memory.used,driver_version,pci.bus_id"
SMI_APP_FIELDS = "gpu_uuid,pid,process_name,used_memory"
MARKER = b"RANKWISE_LAUNCH_ID="
LAUNCHES = os.path.expanduser("~/.rankwise/launches")
HEADER_MAX = 200 * 1024 * 1024  # safetensors' own limit is 100 MB
CONFIG_MAX = 4 * 1024 * 1024  # a config.json larger than this is no model's
NUMBERS = re.compile(r"\.(layers|h|blocks|experts)\.\d+\.")
RESCAN_S = 10.0  # how often ``watch`` reads the whole of /proc for members it cannot see
OOM_WORDS = ("out of memory", "oom-kill", "oom_reaper", "killed process", "invoked oom-killer")


# --- files and /proc ------------------------------------------------------------------------


def _read(path: str, mode: str = "r") -> Any:
    try:
        with open(path, mode) as handle:
            return handle.read()
    except OSError:
        return None


def _write(folder: str, name: str, text: str) -> None:
    temp = os.path.join(folder, name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(temp, os.path.join(folder, name))


def _int(text: Any) -> int | None:
    try:
        return int(str(text).strip()) if text is not None else None
    except ValueError:
        return None


def _field(folder: str, name: str) -> str | None:
    text = _read(os.path.join(folder, name))
    return text.strip() if text is not None else None


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (its kB are KiB)."""
    values: dict[str, int] = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return values


def _uptime() -> float:
    return float((_read("/proc/uptime") or "0").split()[0])


def _boot_time() -> float:
    for line in (_read("/proc/stat") or "").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def process(pid: int, uptime: float | None = None) -> dict[str, Any] | None:
    """One process as /proc shows it, or None when it is gone."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    # Reading the command line or environment of a process in D state can block on its memory
    # map (the way ``ps`` hangs): for those only the name from ``stat`` is read.
    stuck = fields[0] == "D"
    cmdline = b"" if stuck else _read(f"/proc/{pid}/cmdline", "rb") or b""
    environ = b"" if stuck else _read(f"/proc/{pid}/environ", "rb") or b""
    launch = None
    for item in environ.split(b"\0"):
        if item.startswith(MARKER):
            launch = item[len(MARKER) :].decode(errors="replace")
    status = _read(f"/proc/{pid}/status") or ""
    uid = next((int(r.split()[1]) for r in status.splitlines() if r.startswith("Uid:")), None)
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "pid": pid,
        "ppid": int(fields[1]),
        "state": fields[0],
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "name": name,
        "command": cmdline.replace(b"\0", b" ").decode(errors="replace").strip()[:300]
        or f"[{name}]",
        "rss_bytes": int(fields[21]) * os.sysconf("SC_PAGE_SIZE"),
        "elapsed_s": round(
            (uptime if uptime is not None else _uptime()) - int(fields[19]) / ticks, 1
        ),
        "uid": uid,
        "launch_marker": launch,
        "start": int(fields[19]),  # clock ticks after boot: with the PID, who this process is
        "started_at": round(_boot_time() + int(fields[19]) / ticks, 1),
    }


def _pids() -> list[int]:
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def _alive(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in found if p["state"] not in ("Z", "X")]


def members(pgid: int | None) -> list[dict[str, Any]]:
    """Processes of the launch's session or process group (zombies included, marked ``Z``),
    from a read of the whole of /proc."""
    if not pgid:
        return []
    found = [info for info in map(process, _pids()) if info and pgid in (info["pgid"], info["sid"])]
    return sorted(found, key=lambda p: p["pid"])


def _children(pid: int) -> list[int] | None:
    """The children of ``pid`` (every thread's), or None where the kernel does not say."""
    found: list[int] = []
    tasks = glob.glob(f"/proc/{pid}/task/*/children")
    if not tasks and os.path.isdir(f"/proc/{pid}/task"):
        return None  # no CONFIG_PROC_CHILDREN: only a whole read of /proc finds them
    for path in tasks:
        found += [int(c) for c in (_read(path) or "").split()]
    return found


def _members_near(pgid: int, known: list[int]) -> list[dict[str, Any]] | None:
    """The group's members among ``known`` PIDs and their children, or None when a whole read
    of /proc is needed (the kernel hides children)."""
    seen: dict[int, dict[str, Any]] = {}
    todo = list(known)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        info = process(pid)
        if info is None or pgid not in (info["pgid"], info["sid"]):
            continue
        seen[pid] = info
        children = _children(pid)
        if children is None:
            return None
        todo += children
    return sorted(seen.values(), key=lambda p: p["pid"])


def _listening() -> list[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        lines = (_read(table) or "").splitlines()[1:]
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def _shm_bytes() -> int | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def shm_files(most: int = 500) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    try:
        names = sorted(os.listdir("/dev/shm"))[:most]
    except OSError:
        return found
    for name in names:
        with contextlib.suppress(OSError):
            found.append({"name": name, "bytes": os.path.getsize(os.path.join("/dev/shm", name))})
    return found


# --- probe ----------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: The panel's pynvml.py as it arrived on stdin (``--pynvml``): a JSON header line, then zlib.
_SHIPPED: list[bytes] = []
#: Which module answered for NVML: ``{"from": "node" | "panel" | None, "version", "sha256"}``.
PYNVML: dict[str, Any] = {}


def _import_pynvml() -> Any:
    """The node's own ``pynvml``, else the panel's copy of nvidia-ml-py's (when sent); raises
    ImportError (and says so in ``PYNVML``) when there is neither."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        if not _SHIPPED:
            PYNVML.update({"from": None, "error": str(exc)})
            raise
    else:
        PYNVML.update({"from": "node", "version": _installed_version()})
        return pynvml
    import hashlib
    import types
    import zlib

    head, _, packed = _SHIPPED[0].partition(b"\n")
    header = json.loads(head)
    source = zlib.decompress(packed)
    module = types.ModuleType("pynvml")
    module.__file__ = f"pynvml.py (nvidia-ml-py {header['version']}, sent by the panel)"
    # nvidia-ml-py looks itself up in sys.modules while it loads (its error classes).
    sys.modules["pynvml"] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    PYNVML.update(
        {
            "from": "panel",
            "version": header["version"],
            "sha256": hashlib.sha256(source).hexdigest(),
        }
    )
    return module


def _installed_version() -> str | None:
    try:
        from importlib.metadata import version  # Python 3.8+

        return version("nvidia-ml-py")
    except Exception:  # older Python, or pynvml from elsewhere (the old "pynvml" package)
        return None


def nvml() -> dict[str, object]:
    """GPUs and their processes through NVML, or raise with NVML's own words."""
    pynvml = _import_pynvml()
    pynvml.nvmlInit()
    try:
        gpus: list[dict[str, object]] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            processes = [
                {"pid": p.pid, "used_memory_bytes": p.usedGpuMemory or 0}
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            ]
            gpus.append(
                {
                    "index": index,
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "memory_total_bytes": memory.total,
                    "memory_used_bytes": memory.used,
                    "processes": processes,
                }
            )
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        return {
            "gpus": gpus,
            "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
        }
    finally:
        pynvml.nvmlShutdown()


def smi() -> dict[str, str]:
    """The raw CSV of nvidia-smi; the panel parses it."""
    gpus = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_GPU_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    if gpus.returncode != 0:
        raise RuntimeError((gpus.stdout + gpus.stderr).strip() or f"exit {gpus.returncode}")
    apps = subprocess.run(
        ["nvidia-smi", f"--query-compute-apps={SMI_APP_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    return {"gpu_csv": gpus.stdout, "apps_csv": apps.stdout if apps.returncode == 0 else ""}


def process_names(pids: list[int]) -> dict[str, str]:
    return {
        str(p): (_read(f"/proc/{p}/cmdline", "rb") or b"").split(b"\0")[0].decode(errors="replace")
        for p in pids
    }


def process_info(pids: list[int]) -> dict[str, dict[str, Any]]:
    """For each PID: the Rankwise launch it belongs to and its user. The launch is the one its
    ``RANKWISE_LAUNCH_ID`` names, or, where the environment cannot be read (a process in D
    state), the one whose supervisor leads its session: a rank re-parented to PID 1 when its
    server died keeps its session id."""
    sessions = _launch_sessions()
    found: dict[str, dict[str, Any]] = {}
    for pid in pids:
        info = process(pid)
        if info is None:
            continue
        try:
            user = pwd.getpwuid(info["uid"]).pw_name if info["uid"] is not None else None
        except KeyError:
            user = str(info["uid"])
        launch = info["launch_marker"]
        if launch is None and info["sid"] in sessions:
            owner, ended = sessions[info["sid"]]
            # Started after the launch ended: someone else's session on a reused PID.
            launch = owner if ended is None or info["started_at"] <= ended + 1 else None
        found[str(pid)] = {"launch": launch, "user": user}
    return found


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state and session id from ``stat`` alone (never blocks on its memory)."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[3])


def live_launches() -> list[str]:
    """The launches with a process left in their session (the supervisor's, which every
    process it started keeps, re-parented or not): their host memory may still be pinned."""
    sessions = _launch_sessions()
    alive = set()
    for pid in _pids() if sessions else []:
        found = _stat(pid)
        if found is not None and found[0] not in ("Z", "X") and found[1] in sessions:
            alive.add(sessions[found[1]][0])
    return sorted(alive)


def _launch_sessions() -> dict[int, tuple[str, float | None]]:
    """Session id → (launch id, when its server exited, epoch s, or None) for each launch
    folder whose session is the launch's: led by its supervisor, or by no one any more."""
    sessions: dict[int, tuple[str, float | None]] = {}
    for f in launch_folders():
        if not f["pgid"] or not f["launch_id"]:
            continue
        leader = None if f["leader_alive"] else _stat(f["pgid"])
        if leader is not None and leader[1] == f["pgid"]:
            continue  # the PID leads another session now
        try:
            ended: float | None = os.stat(os.path.join(f["dir"], "exit_status")).st_mtime
        except OSError:
            ended = None
        sessions[f["pgid"]] = (f["launch_id"], ended)
    return sessions


def cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        text = _read(path)
        if text is not None:
            text = text.strip()
            return None if text == "max" or int(text) >= 2**62 else int(text)
    return None


def sglang(python: str) -> tuple[str | None, str | None]:
    try:
        result = subprocess.run(
            [python, "-c", "import sglang, sys; sys.stdout.write(sglang.__version__)"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"{python}: no answer within 20 s (import sglang hangs?)"
    except OSError as exc:
        return None, f"{python}: {exc}"
    if result.returncode != 0:
        last = result.stderr.strip().splitlines() or ["exit status " + str(result.returncode)]
        return None, f"{python}: {last[-1]}"
    return result.stdout.strip(), None


def accounts(most: int = 5000) -> list[str] | None:
    """The node's user names (``getpwall``: /etc/passwd and any directory NSS enumerates), for
    checking the user servers run as; None when they cannot be listed or are too many."""
    try:
        names = sorted({entry.pw_name for entry in pwd.getpwall()})
    except Exception:  # an NSS source that refuses to enumerate
        return None
    return names if len(names) <= most else None


def os_release() -> str:
    for line in (_read("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return platform.system()


def interfaces() -> list[list[str]]:
    """The node's addresses as ``[interface, address/prefix]`` pairs (IPv4 and IPv6, link-local
    ones left out: no other node reaches them), from iproute2's ``ip -j addr``; ``[]`` without
    it. What a multi-node launch meets on (``domain.node_group.meeting``)."""
    try:
        out = subprocess.run(
            ["ip", "-j", "addr", "show"], capture_output=True, text=True, timeout=5, check=False
        )
        links = json.loads(out.stdout or "[]")
    except (OSError, ValueError, subprocess.SubprocessError):
        return []
    found = []
    for link in links if isinstance(links, list) else []:
        for addr in link.get("addr_info") or []:
            if addr.get("family") in ("inet", "inet6") and addr.get("scope") != "link":
                found.append(
                    [str(link.get("ifname")), f"{addr.get('local')}/{addr.get('prefixlen')}"]
                )
    return found


def probe(args: list[str]) -> dict[str, Any]:
    live = "--live" in args
    args = [a for a in args if a != "--live"]
    errors: dict[str, str | None] = {}
    doc: dict[str, Any] = {"probe": 1, "errors": errors}
    try:
        doc["nvml"] = nvml()
    except Exception as exc:  # NVML missing or failing: say why, then try nvidia-smi
        errors["nvml"] = f"{type(exc).__name__}: {exc}"
    doc["pynvml"] = PYNVML
    if "nvml" not in doc:
        try:
            doc["nvidia_smi"] = smi()
        except Exception as exc2:
            errors["nvidia_smi"] = f"{type(exc2).__name__}: {exc2}"
    pids = [p["pid"] for gpu in doc.get("nvml", {}).get("gpus", []) for p in gpu["processes"]]
    for line in doc.get("nvidia_smi", {}).get("apps_csv", "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > 1 and cells[1].isdigit():
            pids.append(int(cells[1]))
    doc["process_names"] = process_names(pids)
    doc["process_info"] = process_info(pids)
    doc["live_launches"] = live_launches()
    doc["meminfo"] = meminfo()
    if not live:
        doc["cgroup_limit_bytes"] = cgroup_limit()
        doc["shm_bytes"] = _shm_bytes()
        doc["cpu_count"] = os.cpu_count()
        doc["os"] = os_release()
        doc["kernel"] = platform.release()
        doc["interfaces"] = interfaces()
        doc["accounts"] = accounts()
        doc["sglang_version"], errors["sglang"] = sglang(args[0] if args else "python3")
    return doc


# --- model folders --------------------------------------------------------------------------


def _stamp(path: str, names: list[str]) -> str:
    size, newest = 0, 0
    for name in names:
        info = os.stat(os.path.join(path, name))
        size += info.st_size
        newest = max(newest, info.st_mtime_ns)
    return f"{size}:{newest}"


def _header(file: str) -> dict[str, object]:
    with open(file, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if length > HEADER_MAX:
            raise ValueError(f"header of {length} bytes")
        doc = json.loads(handle.read(length))
    if not isinstance(doc, dict):
        raise ValueError("header is not a JSON object")
    return doc


def _config(path: str) -> tuple[Any, list[str]] | str:
    """``(config.json, the folder's names)``, or the problem's word."""
    try:
        with open(os.path.join(path, "config.json"), "rb") as handle:
            config = json.loads(handle.read(CONFIG_MAX).decode("utf-8"))
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return "no-config"
    except PermissionError:
        return "denied"
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "bad-config"
    except OSError:
        return "unreadable"
    return (config, names) if isinstance(config, dict) else "bad-config"


def _tensor_groups(
    path: str, weights: list[str]
) -> tuple[dict[tuple[str, str, str], int], str | None]:
    groups: dict[tuple[str, str, str], int] = {}
    problem = None
    for name in weights:
        if not name.endswith(".safetensors"):
            problem = f"{name} is not safetensors"
            continue
        try:
            doc = _header(os.path.join(path, name))
        except (OSError, ValueError) as exc:
            problem = f"{name}: {exc}"
            continue
        for tensor, info in doc.items():
            if tensor == "__metadata__" or not isinstance(info, dict):
                continue
            pattern = NUMBERS.sub(lambda m: f".{m.group(1)}.*.", tensor)
            key = (pattern, str(info.get("dtype")), json.dumps(info.get("shape")))
            groups[key] = groups.get(key, 0) + 1
    return groups, problem


def model(args: list[str]) -> dict[str, Any]:
    # A problem is answered as a word the panel turns into a sentence: no traceback, and no
    # exception text about the node's files, leaves the node.
    path, known = args[0], (args[1] if len(args) > 1 else "")
    if not os.path.isdir(path):
        return {"problem": "no-folder"}
    found = _config(path)
    if isinstance(found, str):
        return {"problem": found}
    config, names = found
    weights = [n for n in names if n.endswith((".safetensors", ".bin", ".pt"))]
    now = _stamp(path, weights + ["config.json"])
    if known and known == now:
        return {"unchanged": True, "stamp": now}
    total = sum(os.path.getsize(os.path.join(path, n)) for n in weights)
    groups, problem = _tensor_groups(path, weights)
    out: dict[str, Any] = {"config": config, "weights_bytes": total, "stamp": now}
    if problem is None and groups:
        out["tensors"] = [[p, d, json.loads(s), c] for (p, d, s), c in sorted(groups.items())]
    else:
        out["headers_error"] = problem or "no safetensors files"
    return out


def preflight(args: list[str]) -> dict[str, Any]:
    path, ports = args[0], [int(p) for p in args[1:]]
    if not path.startswith("/"):
        found, detail = None, "not a local path; SGLang will look it up on the Hugging Face Hub"
    elif not os.path.isdir(path):
        found, detail = False, "no such folder on the node"
    elif not os.path.isfile(os.path.join(path, "config.json")):
        found, detail = False, "the folder has no config.json"
    else:
        found, detail = True, "config.json present"
    listening = _listening()
    return {
        "model_found": found,
        "model_detail": detail,
        "shm_bytes": _shm_bytes(),
        "listening": [p for p in ports if p in listening],
    }


def prepare(args: list[str]) -> dict[str, Any]:
    # Everything a launch's pre-flight reads, in one run: FOLDER PYTHON MODEL_PATH STAMP PORT...
    # (``-`` for no model path, no stamp). A group already running in the folder is adopted and
    # nothing else is read.
    folder, python, path, stamp, ports = _folder(args[0]), args[1], args[2], args[3], args[4:]
    out: dict[str, Any] = {"status": _status(folder)}
    if out["status"]["pid"] is not None:
        return out
    out["probe"] = probe([python])
    if path.startswith("/"):
        try:
            out["model"] = model([path, *([stamp] if stamp != "-" else [])])
        except OSError:  # the folder changed under the read: said as a word, as model() does
            out["model"] = {"problem": "unreadable"}
    out["preflight"] = preflight([path, *ports])
    return out


# --- launches -------------------------------------------------------------------------------


def _status(folder: str, found: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    pgid = _int(_field(folder, "pgid"))
    found = members(pgid) if found is None else found
    try:
        log_size: int | None = os.path.getsize(os.path.join(folder, "server.log"))
    except OSError:
        log_size = None
    return {
        "dir": folder,
        "exists": os.path.isdir(folder),
        "launch_id": _field(folder, "launch_id"),
        "pid": _int(_field(folder, "pid")),
        "pgid": pgid,
        "exit_status": _int(_field(folder, "exit_status")),
        "log": os.path.join(folder, "server.log"),
        "log_size": log_size,
        "alive": bool(_alive(found)),
        "members": found,
    }


def _account(name: str) -> Any:
    """The node's account ``name`` to run the server as; exits with the reason when unusable."""
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        raise SystemExit(f"cannot run servers as {name!r}: no such user on this node") from None
    if account.pw_uid != os.geteuid() and os.geteuid() != 0:
        raise SystemExit(
            f"cannot run servers as {name!r}: the SSH user is not root, so it cannot switch user"
        )
    return account


def _become(account: Any) -> Any:
    """A ``preexec_fn`` that drops the child to ``account`` (groups, then gid, then uid)."""

    def drop() -> None:
        os.initgroups(account.pw_name, account.pw_gid)
        os.setgid(account.pw_gid)
        os.setuid(account.pw_uid)

    return drop


def start(folder: str, python: str) -> dict[str, Any]:
    if _field(folder, "pid") is not None:
        return dict(_status(folder), adopted=True)
    request = json.load(sys.stdin)
    account = _account(request["run_as"]) if request.get("run_as") else None
    if account is not None and account.pw_uid == os.geteuid():
        account = None  # already that user
    os.makedirs(folder, mode=0o700, exist_ok=True)
    _write(folder, "command", request["shown_command"])
    _write(folder, "env", json.dumps(request["shown_env"], indent=1, sort_keys=True))
    _write(folder, "launch_id", str(request["launch_id"]))
    env = dict(os.environ)
    if account is not None:
        env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
    env.update(request["env"])
    env["PYTHONUNBUFFERED"] = "1"
    env["RANKWISE_LAUNCH_ID"] = str(request["launch_id"])
    read_fd, write_fd = os.pipe()
    if os.fork() == 0:
        os.close(read_fd)
        _supervise(
            folder, [python, "-m", "sglang.launch_server", *request["args"]], env, write_fd, account
        )
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as handle:
        handle.read()  # EOF once the supervisor wrote pid and pgid (or failed)
    return dict(_status(folder), adopted=False)


def _supervise(folder: str, argv: list[str], env: dict[str, str], ready: int, account: Any) -> None:
    """The session leader: starts the server (as ``account`` if given), records pid/pgid,
    waits, records the exit."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    # A no-op handler (not SIG_IGN, which the server would inherit) keeps the supervisor alive
    # through the group's SIGTERM, so it can record the server's exit status.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGHUP, lambda *_: None)
    log = os.open(os.path.join(folder, "server.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    cwd, drop = folder, None
    if account is not None:
        cwd = os.path.join(folder, "work")
        os.makedirs(cwd, mode=0o700, exist_ok=True)
        os.chown(cwd, account.pw_uid, account.pw_gid)
        drop = _become(account)
    try:
        server = subprocess.Popen(
            argv,
            stdin=null,
            stdout=log,
            stderr=log,
            env=env,
            cwd=cwd,  # entered before the drop: the user needs no way through DIR's parents
            close_fds=True,
            preexec_fn=drop,  # the supervisor has a single thread: safe
        )
    except (OSError, subprocess.SubprocessError) as exc:
        os.write(log, f"rankwise: cannot start {argv[0]}: {exc}\n".encode())
        _write(folder, "pgid", str(os.getpid()))
        _write(folder, "pid", "0")
        _write(folder, "exit_status", "127")
        os.close(ready)
        return
    _write(folder, "pgid", str(os.getpid()))
    _write(folder, "pid", str(server.pid))
    os.close(ready)
    _write(folder, "exit_status", str(server.wait()))


def stop(folder: str, grace: float, wait: float) -> dict[str, Any]:
    pgid = _int(_field(folder, "pgid"))
    steps = []
    for sig, patience in ((signal.SIGTERM, grace), (signal.SIGKILL, wait)):
        if not _alive(members(pgid)):
            break
        # The supervisor survives SIGTERM; only the server and its ranks get the chance to exit.
        try:
            if pgid:
                os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        steps.append(signal.Signals(sig).name)
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            left = _alive(members(pgid))
            if not left or (sig == signal.SIGTERM and [p["pid"] for p in left] == [pgid]):
                break
            time.sleep(0.1)
    left = _alive(members(pgid))
    if left and [p["pid"] for p in left] == [pgid] and pgid:  # only the supervisor is left
        os.kill(pgid, signal.SIGKILL)
        time.sleep(0.1)
        left = _alive(members(pgid))
    return dict(_status(folder), signals=steps, remaining=left)


class _GpuMemory:
    """The GPUs' used memory through one NVML session (for ``watch``), or None without NVML."""

    def __init__(self) -> None:
        try:
            pynvml = _import_pynvml()
            pynvml.nvmlInit()
            self.nvml: Any = pynvml
            self.handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
        except Exception:
            self.nvml = None

    def used(self) -> dict[str, int] | None:
        if self.nvml is None:
            return None
        try:
            return {
                str(i): self.nvml.nvmlDeviceGetMemoryInfo(h).used
                for i, h in enumerate(self.handles)
            }
        except Exception:
            return None


def watch(folder: str, interval: float, beat: float) -> None:
    """Print the launch's status whenever it changes, until the panel closes the channel (the
    next write finds the pipe broken)."""
    gpus: _GpuMemory | None = None  # opened after the first line: NVML can take a while
    known: list[int] = []
    last_key, last_sent, last_full = None, 0.0, 0.0
    while True:
        pgid = _int(_field(folder, "pgid"))
        now = time.monotonic()
        found = (
            _members_near(pgid, known) if pgid and known and now - last_full < RESCAN_S else None
        )
        if found is None:
            found, last_full = members(pgid), now
        known = [p["pid"] for p in found if p["state"] not in ("Z", "X")] or (
            [pgid] if pgid else []
        )
        doc = _status(folder, found)
        key = (
            doc["alive"],
            doc["exit_status"],
            doc["pid"],
            # Running or sleeping is no change (a busy rank flips between them every tick);
            # defunct, gone or stuck in D is.
            [(p["pid"], p["state"] if p["state"] in "ZXD" else "", p["command"]) for p in found],
        )
        if key != last_key or now - last_sent >= beat or not doc["alive"]:
            memory = meminfo()
            doc["memory"] = {
                "MemTotal": memory.get("MemTotal"),
                "MemAvailable": memory.get("MemAvailable"),
            }
            doc["gpu_used"] = gpus.used() if gpus is not None else None
            doc["time"] = time.time()
            try:
                sys.stdout.write(json.dumps(doc) + "\n")
                sys.stdout.flush()
            except BrokenPipeError:  # the panel closed the channel: done
                return
            last_key, last_sent = key, now
        if gpus is None:
            gpus = _GpuMemory()
        time.sleep(interval)


def _oom_lines() -> list[str]:
    # A node busy with a dying server can be slow to answer: one more, longer try before the
    # snapshot goes without its kernel lines.
    out = b""
    for timeout in (10, 30):
        try:
            out = subprocess.run(["dmesg", "-T"], capture_output=True, timeout=timeout).stdout
            break
        except subprocess.TimeoutExpired:
            continue
        except (OSError, subprocess.SubprocessError):
            return []
    lines = out.decode(errors="replace").splitlines()
    return [line for line in lines if any(w in line.lower() for w in OOM_WORDS)][-50:]


def snapshot(folder: str) -> dict[str, Any]:
    return {
        "time": time.time(),
        "meminfo": meminfo(),
        "launch": _status(folder),
        "oom_lines": _oom_lines(),
        "listening_ports": _listening(),
        "shm_files": shm_files(200),
    }


# --- GPU holders and cleanup steps ----------------------------------------------------------


def _devices(pid: int) -> list[str]:
    """The NVIDIA device files the process has open: ``"0"``, ``"3"``, ``"ctl"``, ``"uvm"``."""
    found = set()
    for fd in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            rest = target[len("/dev/nvidia") :]
            found.add(rest.lstrip("-") if not rest.isdigit() else rest)
    return sorted(found, key=lambda d: (not d.isdigit(), int(d) if d.isdigit() else 0, d))


def launch_folders() -> list[dict[str, Any]]:
    found = []
    for folder in sorted(glob.glob(os.path.join(LAUNCHES, "*"))):
        pgid = _field(folder, "pgid") or ""
        leader = _read(f"/proc/{pgid}/cmdline", "rb") if pgid.isdigit() else None
        found.append(
            {
                "dir": folder,
                "launch_id": _field(folder, "launch_id") or None,
                "pgid": int(pgid) if pgid.isdigit() else None,
                # The group is the launch's only while its leader is the launch's supervisor
                # (started with this folder); a reused PID leads someone else's group.
                "leader_alive": bool(leader) and folder.encode() in (leader or b""),
                "exit_status": _field(folder, "exit_status") or None,
            }
        )
    return found


def holders(pgids: list[int]) -> dict[str, Any]:
    uptime = _uptime()
    folders = launch_folders()
    groups = set(pgids) | {f["pgid"] for f in folders if f["pgid"]}
    found = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        devices = _devices(pid)
        info = process(pid, uptime) if devices or groups else None
        if info is None:
            continue
        if devices or info["pgid"] in groups or info["sid"] in groups or info["launch_marker"]:
            info["devices"] = devices
            found.append(info)
    return {
        "time": time.time(),
        "processes": found,
        "meminfo": meminfo(),
        "shm_files": shm_files(),
        "launches": folders,
    }


def _same(pid: int, start: int | None) -> dict[str, Any] | None:
    """The live process ``pid`` if it is still the one that started at ``start``."""
    info = process(pid)
    if info is None or info["state"] in ("Z", "X"):
        return None
    return info if start is None or info["start"] == start else None


def send(sig_name: str, wait: float, targets: list[str]) -> dict[str, Any]:
    """Signal each target that is still the process it names (a PID reused by another process
    since it was read is left alone), then wait for them."""
    sig = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}[sig_name]
    sent, errors, watched = [], [], {}
    for target in targets:
        text, _, at = target.partition("@")
        number, start = int(text), (int(at) if at else None)
        try:
            if number < 0:
                group = {p: process(p) for p in _pids()}
                os.killpg(-number, sig)
                watched.update(
                    {p: i["start"] for p, i in group.items() if i and i["pgid"] == -number}
                )
            elif _same(number, start) is None:
                errors.append(f"{number}: gone, or no longer the process that was read")
                continue
            else:
                os.kill(number, sig)
                watched[number] = start
            sent.append(str(number))
        except ProcessLookupError:
            errors.append(f"{number}: no such process")
        except PermissionError:
            errors.append(f"{number}: not permitted (another user's process)")
    deadline = time.monotonic() + wait
    remaining = [i for i in (_same(p, s) for p, s in sorted(watched.items())) if i]
    while remaining and time.monotonic() < deadline:
        time.sleep(0.2)
        remaining = [i for i in (_same(p, s) for p, s in sorted(watched.items())) if i]
    return {"signal": f"SIG{sig_name}", "sent": sent, "errors": errors, "remaining": remaining}


def reap(wait: float, pids: list[int]) -> dict[str, Any]:
    parents = set()
    for pid in pids:
        info = process(pid)
        if info is not None and info["state"] == "Z" and info["ppid"] > 1:
            parents.add(info["ppid"])
    for parent in parents:
        with contextlib.suppress(OSError):
            os.kill(parent, signal.SIGCHLD)
    deadline = time.monotonic() + wait
    left = [p for p in map(process, pids) if p is not None and p["state"] == "Z"]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in map(process, pids) if p is not None and p["state"] == "Z"]
    return {"signalled_parents": sorted(parents), "defunct": left}


def reset(index: str) -> dict[str, Any]:
    command = ["nvidia-smi", "--gpu-reset", "-i", index]
    try:
        done = subprocess.run(command, capture_output=True, timeout=120)
    except FileNotFoundError:
        return {"command": command, "exit_status": 127, "output": "nvidia-smi: not found"}
    except subprocess.TimeoutExpired:
        return {"command": command, "exit_status": None, "output": "no answer within 120 s"}
    output = (done.stdout + done.stderr).decode(errors="replace").strip()
    return {"command": command, "exit_status": done.returncode, "output": output}


# --- the nodes' network ---------------------------------------------------------------------


def _port(text: str) -> int:
    """A TCP port number from the command line; exits with the reason when it is none."""
    try:
        port = int(text)
    except ValueError:
        raise SystemExit(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise SystemExit(f"port {port} is outside 1..65535")
    return port


def _seconds(text: str, low: float, high: float, what: str) -> float:
    """A number of seconds from the command line, bounded to ``low..high``; exits with the
    reason when it is no number."""
    try:
        value = float(text)
    except ValueError:
        raise SystemExit(f"{what} must be a number of seconds, not {text!r}") from None
    if value != value:  # NaN
        raise SystemExit(f"{what} must be a number of seconds, not {text!r}")
    return min(max(value, low), high)


def _args(args: list[str], names: str) -> list[str]:
    if len(args) != len(names.split()):
        raise SystemExit(f"expected {names}, got {len(args)} argument(s)")
    return args


def _bind(family: int, address: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((address, port))
        sock.listen(64)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def listen(args: list[str]) -> dict[str, Any]:
    """Bind PORT on 0.0.0.0 (and :: where IPv6 is there), then leave a detached process
    accepting and closing connections for SECONDS, or until ACCEPT connections came (when
    given: the port is free again for the server right after the nodes tried it); answers once
    the listener is bound."""
    accept = 0
    if len(args) == 3:
        accept = int(_seconds(args.pop(), 1, 1024, "ACCEPT"))
    port_text, seconds_text = _args(args, "PORT SECONDS")
    port, seconds = _port(port_text), _seconds(seconds_text, 1, 120, "SECONDS")
    try:
        sockets = [_bind(socket.AF_INET, "0.0.0.0", port)]
    except OSError as exc:
        return {"listening": False, "port": port, "error": exc.strerror or str(exc)}
    if socket.has_ipv6:
        with contextlib.suppress(OSError):  # no IPv6 on the node, or :: alone is taken
            sockets.append(_bind(socket.AF_INET6, "::", port))
    read_fd, write_fd = os.pipe()
    if os.fork() == 0:
        os.close(read_fd)
        try:
            _serve(sockets, time.monotonic() + seconds, write_fd, accept)
        finally:
            os._exit(0)
    os.close(write_fd)
    for sock in sockets:
        sock.close()
    with os.fdopen(read_fd) as handle:
        handle.read()  # EOF once the listener is in its own session, off the SSH channel
    return {"listening": True, "port": port}


def _serve(sockets: list[socket.socket], deadline: float, ready: int, accept: int = 0) -> None:
    """The detached listener: its own session, no stdio (so the SSH command ends now), accept
    and close until ``deadline`` (monotonic) or, with ``accept``, that many connections."""
    os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(ready)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            readable = select.select(sockets, [], [], left)[0]
        except InterruptedError:
            continue
        for sock in readable:
            with contextlib.suppress(OSError):  # gone before it was taken, or would block
                sock.accept()[0].close()
                accept -= 1
                if accept == 0:
                    return


def reach(args: list[str]) -> dict[str, Any]:
    """One TCP connect from this node to HOST:PORT (the first address HOST resolves to) within
    TIMEOUT s: reached, or the OSError's words; elapsed seconds either way."""
    host, port_text, timeout_text = _args(args, "HOST PORT TIMEOUT")
    port, timeout = _port(port_text), _seconds(timeout_text, 0.1, 60, "TIMEOUT")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    began = time.monotonic()
    error = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(timeout)
            sock.connect(address)
    except OSError as exc:  # socket.timeout and socket.gaierror included
        error = str(exc) or type(exc).__name__
    elapsed = round(time.monotonic() - began, 3)
    return {"reached": error is None, "error": error, "elapsed_s": elapsed}


# --- entry point ----------------------------------------------------------------------------


def _folder(text: str) -> str:
    return os.path.abspath(os.path.expanduser(text))


COMMANDS: dict[str, Callable[[list[str]], Any]] = {
    "probe": probe,
    "model": model,
    "preflight": preflight,
    "prepare": prepare,
    "start": lambda a: start(_folder(a[0]), a[1]),
    "status": lambda a: _status(_folder(a[0])),
    "watch": lambda a: watch(_folder(a[0]), float(a[1]), float(a[2])),
    "stop": lambda a: stop(_folder(a[0]), float(a[1]), float(a[2])),
    "snapshot": lambda a: snapshot(_folder(a[0])),
    "holders": lambda a: holders([int(x) for x in a]),
    "signal": lambda a: send(a[0], float(a[1]), a[2:]),
    "reap": lambda a: reap(float(a[0]), [int(x) for x in a[1:]]),
    "reset": lambda a: reset(a[0]),
    "listen": listen,
    "reach": reach,
}


def main(argv: list[str]) -> None:
    if argv[:1] == ["--pynvml"]:
        _SHIPPED.append(sys.stdin.buffer.read())
        argv = argv[1:]
    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(f"unknown command {argv[0] if argv else ''!r}: {', '.join(COMMANDS)}")
    doc = COMMANDS[argv[0]](argv[1:])
    if doc is not None:  # ``watch`` printed its own
        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
