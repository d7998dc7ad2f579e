"""Launch control on a node: run as ``python3 -c SOURCE COMMAND DIR [ARGS]`` (this file's source
as one argument, so stdin stays free for the launch request, which holds secrets that must not
show in the node's process list).

``DIR`` is the launch's folder on the node (``~/.rankwise/launches/<id>``), which holds what the
panel needs to re-adopt the launch after a restart of its own: ``command`` and ``env`` (secrets
masked), ``launch_id``, ``pid`` (the server's main process), ``pgid`` (its process group and
session, made by ``setsid``), ``server.log`` (stdout and stderr) and, once it ended,
``exit_status``.

Commands (each prints one JSON document):
  start DIR PYTHON      start the server from the JSON request on stdin (``args``, ``env``,
                        ``shown_command``, ``shown_env``, ``launch_id``, ``run_as``); adopts
                        instead when DIR/pid exists
  status DIR            pid, pgid, exit status, log size, live members of the process group
  stop DIR GRACE WAIT   SIGTERM the group, wait GRACE s, SIGKILL, wait WAIT s; what remains
  snapshot DIR          meminfo, the group's processes with states, kernel OOM lines, ports
  preflight MODEL PORT… listening ports among PORT…, MODEL/config.json, /dev/shm size
With ``run_as`` (a user name; empty: the SSH user) the server runs as that user: the supervisor
(still the SSH user, root) opens ``server.log`` and changes into ``DIR/work`` (owned by the user)
before it drops to the user's uid, gid and groups, so the log streams as before and the control
files (``pid``, ``pgid``…), which root acts on, stay out of the server's reach.

Stdlib only, Python 3.7+.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from typing import Any


def _path(folder: str, name: str) -> str:
    return os.path.join(folder, name)


def _read(folder: str, name: str) -> str | None:
    try:
        with open(_path(folder, name)) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _write(folder: str, name: str, text: str) -> None:
    temp = _path(folder, name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(temp, _path(folder, name))


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _stat(pid: int) -> dict[str, Any] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            raw = handle.read()
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    rss_pages = int(fields[21])
    return {
        "pid": pid,
        "state": fields[0],
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "name": name,
        "command": cmdline[:300] or f"[{name}]",
        "rss_bytes": rss_pages * os.sysconf("SC_PAGE_SIZE"),
    }


def members(pgid: int | None) -> list[dict[str, Any]]:
    """Processes of the launch's session or process group (zombies included, marked ``Z``)."""
    if not pgid:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _stat(int(entry))
            if info and (info["pgid"] == pgid or info["sid"] == pgid):
                found.append(info)
    return sorted(found, key=lambda p: p["pid"])


def _alive(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in found if p["state"] != "Z"]


def status(folder: str) -> dict[str, Any]:
    pgid = _int(_read(folder, "pgid"))
    found = members(pgid)
    try:
        log_size = os.path.getsize(_path(folder, "server.log"))
    except OSError:
        log_size = None
    return {
        "dir": folder,
        "exists": os.path.isdir(folder),
        "launch_id": _read(folder, "launch_id"),
        "pid": _int(_read(folder, "pid")),
        "pgid": pgid,
        "exit_status": _int(_read(folder, "exit_status")),
        "log": _path(folder, "server.log"),
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
    if _read(folder, "pid") is not None:
        return dict(status(folder), adopted=True)
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
        _supervise(folder, python, request["args"], env, write_fd, account)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as handle:
        handle.read()  # EOF once the supervisor wrote pid and pgid (or failed)
    return dict(status(folder), adopted=False)


def _supervise(
    folder: str, python: str, args: list[str], env: dict[str, str], ready: int, account: Any
) -> None:
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
    log = os.open(_path(folder, "server.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    argv = [python, "-m", "sglang.launch_server", *args]
    cwd, drop = folder, None
    if account is not None:
        cwd = _path(folder, "work")
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
        os.write(log, f"rankwise: cannot start {python}: {exc}\n".encode())
        _write(folder, "pgid", str(os.getpid()))
        _write(folder, "pid", "0")
        _write(folder, "exit_status", "127")
        os.close(ready)
        return
    _write(folder, "pgid", str(os.getpid()))
    _write(folder, "pid", str(server.pid))
    os.close(ready)
    code = server.wait()
    _write(folder, "exit_status", str(code))


def stop(folder: str, grace: float, wait: float) -> dict[str, Any]:
    pgid = _int(_read(folder, "pgid"))
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
            if not left or (sig == signal.SIGTERM and _only_supervisor(left, pgid)):
                break
            time.sleep(0.1)
    left = _alive(members(pgid))
    if left and _only_supervisor(left, pgid) and pgid:
        os.kill(pgid, signal.SIGKILL)
        time.sleep(0.1)
        left = _alive(members(pgid))
    return dict(status(folder), signals=steps, remaining=left)


def _only_supervisor(left: list[dict[str, Any]], pgid: int | None) -> bool:
    return [p["pid"] for p in left] == [pgid]


def _meminfo() -> dict[str, int]:
    found = {}
    with open("/proc/meminfo") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                found[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return found


def _listening() -> list[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    if fields[3] == "0A":  # TCP_LISTEN
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return sorted(ports)


def _oom_lines() -> list[str]:
    try:
        out = subprocess.run(["dmesg", "-T"], capture_output=True, timeout=10).stdout.decode(
            errors="replace"
        )
    except (OSError, subprocess.SubprocessError):
        return []
    words = ("out of memory", "oom-kill", "oom_reaper", "killed process", "invoked oom-killer")
    return [line for line in out.splitlines() if any(w in line.lower() for w in words)][-50:]


def snapshot(folder: str) -> dict[str, Any]:
    shm = []
    try:
        for name in sorted(os.listdir("/dev/shm"))[:200]:
            try:
                shm.append({"name": name, "bytes": os.path.getsize(os.path.join("/dev/shm", name))})
            except OSError:
                continue
    except OSError:
        pass
    return {
        "time": time.time(),
        "meminfo": _meminfo(),
        "launch": status(folder),
        "oom_lines": _oom_lines(),
        "listening_ports": _listening(),
        "shm_files": shm,
    }


def preflight(model: str, ports: list[int]) -> dict[str, Any]:
    config = os.path.join(model, "config.json")
    if not model.startswith("/"):
        found, detail = None, "not a local path; SGLang will look it up on the Hugging Face Hub"
    elif not os.path.isdir(model):
        found, detail = False, "no such folder on the node"
    elif not os.path.isfile(config):
        found, detail = False, "the folder has no config.json"
    else:
        found, detail = True, "config.json present"
    try:
        st = os.statvfs("/dev/shm")
        shm = st.f_blocks * st.f_frsize
    except OSError:
        shm = None
    listening = _listening()
    return {
        "model_found": found,
        "model_detail": detail,
        "shm_bytes": shm,
        "listening": [p for p in ports if p in listening],
    }


def main(argv: list[str]) -> None:
    command = argv[0]
    if command == "preflight":
        doc = preflight(argv[1], [int(p) for p in argv[2:]])
    else:
        folder = os.path.abspath(os.path.expanduser(argv[1]))
        if command == "start":
            doc = start(folder, argv[2])
        elif command == "status":
            doc = status(folder)
        elif command == "stop":
            doc = stop(folder, float(argv[2]), float(argv[3]))
        elif command == "snapshot":
            doc = snapshot(folder)
        else:
            raise SystemExit(f"unknown command {command}")
    sys.stdout.write(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
