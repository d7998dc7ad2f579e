"""GPU holders and cleanup steps on a node: run as ``python3 -c SOURCE COMMAND [ARGS]``.

Commands (each prints one JSON document):
  inspect [PGID…]        every process with /dev/nvidia* open (what ``fuser -v /dev/nvidia*``
                         reads: /proc/*/fd; it sees holders NVML does not list, e.g. in another
                         PID namespace), every member of the given process groups or sessions,
                         every process carrying a launch's ``RANKWISE_LAUNCH_ID``; meminfo;
                         /dev/shm files; the launch folders under ~/.rankwise/launches
  signal SIG WAIT T…     send SIG (TERM, KILL) to each target (PID, or -PGID for a group), then
                         wait at most WAIT s until none is alive; what remains, with states
                         (a process in D state is reported, never waited on beyond WAIT)
  reap WAIT PID…         defunct PIDs: SIGCHLD their parents so they collect them, wait at most
                         WAIT s; what is still defunct, with its parent
  reset INDEX            ``nvidia-smi --gpu-reset -i INDEX``: exit status and its exact words
Stdlib only, Python 3.7+; run as the node's SSH user (root to see every process).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

MARKER = b"RANKWISE_LAUNCH_ID="
LAUNCHES = os.path.expanduser("~/.rankwise/launches")


def _read(path: str, mode: str = "r") -> Any:
    try:
        with open(path, mode) as handle:
            return handle.read()
    except OSError:
        return None


def _uptime() -> float:
    text = _read("/proc/uptime") or "0"
    return float(text.split()[0])


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
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return {
        "pid": pid,
        "ppid": int(fields[1]),
        "state": fields[0],
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "name": name,
        "command": cmdline.replace(b"\0", b" ").decode(errors="replace").strip()[:300]
        or f"[{name}]",
        "elapsed_s": round((uptime if uptime is not None else _uptime()) - started, 1),
        "uid": uid,
        "launch_marker": launch,
        "start": int(fields[19]),  # clock ticks after boot: with the PID, who this process is
        "started_at": round(_boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK"), 1),
    }


def _boot_time() -> float:
    for line in (_read("/proc/stat") or "").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


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


def _pids() -> list[int]:
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def launch_folders() -> list[dict[str, Any]]:
    found = []
    for folder in sorted(glob.glob(os.path.join(LAUNCHES, "*"))):
        pgid = (_read(os.path.join(folder, "pgid")) or "").strip()
        leader = _read(f"/proc/{pgid}/cmdline", "rb") if pgid.isdigit() else None
        found.append(
            {
                "dir": folder,
                "launch_id": (_read(os.path.join(folder, "launch_id")) or "").strip() or None,
                "pgid": int(pgid) if pgid.isdigit() else None,
                # The group is the launch's only while its leader is the launch's supervisor
                # (started with this folder); a reused PID leads someone else's group.
                "leader_alive": bool(leader) and folder.encode() in (leader or b""),
                "exit_status": (_read(os.path.join(folder, "exit_status")) or "").strip() or None,
            }
        )
    return found


def meminfo() -> dict[str, int]:
    values: dict[str, int] = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return values


def shm_files() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    try:
        names = sorted(os.listdir("/dev/shm"))[:500]
    except OSError:
        return found
    for name in names:
        try:
            found.append({"name": name, "bytes": os.path.getsize(os.path.join("/dev/shm", name))})
        except OSError:
            continue
    return found


def inspect(pgids: list[int]) -> dict[str, Any]:
    uptime = _uptime()
    folders = launch_folders()
    groups = set(pgids) | {f["pgid"] for f in folders if f["pgid"]}
    holders = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        devices = _devices(pid)
        info = None
        if devices or groups:
            info = process(pid, uptime)
        if info is None:
            continue
        if devices or info["pgid"] in groups or info["sid"] in groups or info["launch_marker"]:
            info["devices"] = devices
            holders.append(info)
    return {
        "time": time.time(),
        "processes": holders,
        "meminfo": meminfo(),
        "shm_files": shm_files(),
        "launches": folders,
    }


def _alive(pid: int) -> dict[str, Any] | None:
    info = process(pid)
    return info if info is not None and info["state"] not in ("Z", "X") else None


def _target(text: str) -> tuple[int, int | None]:
    """``PID``, ``-PGID`` or ``PID@START`` (the process's start time in clock ticks)."""
    number, _, start = text.partition("@")
    return int(number), int(start) if start else None


def _same(pid: int, start: int | None) -> dict[str, Any] | None:
    """The live process ``pid`` if it is still the one that started at ``start``."""
    info = _alive(pid)
    if info is None or (start is not None and info["start"] != start):
        return None
    return info


def send(sig_name: str, wait: float, targets: list[str]) -> dict[str, Any]:
    """Signal each target that is still the process it names (a PID reused by another process
    since it was read is left alone), then wait for them."""
    sig = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}[sig_name]
    sent, errors, watched = [], [], {}
    for target in targets:
        number, start = _target(target)
        try:
            if number < 0:
                members = {p: process(p) for p in _pids()}
                os.killpg(-number, sig)
                watched.update(
                    {p: i["start"] for p, i in members.items() if i and i["pgid"] == -number}
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

    def left() -> list[dict[str, Any]]:
        return [i for i in (_same(p, s) for p, s in sorted(watched.items())) if i]

    remaining = left()
    while remaining and time.monotonic() < deadline:
        time.sleep(0.2)
        remaining = left()
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


def main(argv: list[str]) -> None:
    command, args = argv[0], argv[1:]
    if command == "inspect":
        doc = inspect([int(a) for a in args])
    elif command == "signal":
        doc = send(args[0], float(args[1]), args[2:])
    elif command == "reap":
        doc = reap(float(args[0]), [int(a) for a in args[1:]])
    elif command == "reset":
        doc = reset(args[0])
    else:
        raise SystemExit(f"unknown command {command!r}")
    sys.stdout.write(json.dumps(doc))


if __name__ == "__main__":
    main(sys.argv[1:])
