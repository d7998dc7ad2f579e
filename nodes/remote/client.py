"""The panel's side of the node protocol: each command of the node agent
(``nodes/remote/agent.py``) as a function that takes an open SSH connection and returns a typed
answer.

One transport: ``python3 -c AGENT COMMAND ARGS…`` (``ssh.run``), with a JSON request on stdin
where a command takes one; one answer format: a JSON document on the last line, read into the
dataclasses below by pydantic. One error type: ``ssh.RemoteError``, whose ``retryable`` says
whether asking again can help (the node away or slow) or not (the agent answered something
the panel cannot read, a command failed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from nodes import ssh
from nodes.domain.probe_parse import NodeFacts, ProbeError, parse_probe
from nodes.domain.redact import mask_assignments
from nodes.remote import shipped

AGENT = (Path(__file__).resolve().parent / "agent.py").read_text()
#: A process as the agent reads it from /proc (``pid``, ``ppid``, ``state``, ``pgid``, ``sid``,
#: ``name``, ``command``, ``rss_bytes``, ``elapsed_s``, ``uid``, ``launch_marker``, ``start``,
#: ``started_at``; ``devices`` in ``holders``). Kept as JSON: it is stored and shown as it is.
Process = dict[str, Any]
T = TypeVar("T")


@dataclass(frozen=True)
class ModelFolder:
    """A model folder on the node: config.json, checkpoint size (bytes) and stamp; ``tensors``
    are ``[pattern, dtype, shape, count]`` groups of the safetensors headers; ``unchanged``
    when the stamp asked about still holds; ``problem`` a word when the folder is unreadable
    (``no-folder``, ``no-config``, ``denied``, ``bad-config``, ``unreadable``)."""

    config: dict[str, Any] | None = None
    weights_bytes: int | None = None
    stamp: str | None = None
    tensors: list[list[Any]] | None = None
    headers_error: str | None = None
    unchanged: bool = False
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v is not False}


@dataclass(frozen=True)
class Preflight:
    """What pre-flight reads on the node: is the model there (None: not a local path), the
    size of /dev/shm (bytes), which of the asked ports something listens on."""

    model_found: bool | None
    model_detail: str
    shm_bytes: int | None
    listening: list[int]


@dataclass(frozen=True)
class Prepared:
    """What a launch's pre-flight reads on the node, in one run of the agent (``prepare``): the
    launch folder's group (``status``; when it runs already it is adopted and nothing else was
    read), the probe (``facts``), the model folder (``model``; None for a path that is not
    local) and the ``preflight`` readings, of the ``ports`` it was asked about."""

    status: GroupStatus
    facts: NodeFacts | None = None
    model: ModelFolder | None = None
    preflight: Preflight | None = None
    ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class GroupStatus:
    """A launch's folder and process group on the node. ``adopted`` (``start``): the launch
    was running already. ``memory`` (MemTotal, MemAvailable in bytes), ``gpu_used`` (GPU index →
    bytes used, None without NVML) and ``time`` come with ``watch``."""

    dir: str
    exists: bool
    launch_id: str | None
    pid: int | None
    pgid: int | None
    exit_status: int | None
    log: str
    log_size: int | None
    alive: bool
    members: list[Process]
    adopted: bool | None = None
    memory: dict[str, int | None] | None = None
    gpu_used: dict[str, int] | None = None
    time: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class StopAnswer:
    """After ``stop``: the group's status, the signals sent, the processes still alive."""

    status: GroupStatus
    signals: list[str]
    remaining: list[Process]


@dataclass(frozen=True)
class Snapshot:
    """The node's memory at a moment (meminfo in bytes), the launch's group, kernel OOM lines,
    listening ports, /dev/shm files (``name``, ``bytes``)."""

    time: float
    meminfo: dict[str, int]
    launch: GroupStatus
    oom_lines: list[str]
    listening_ports: list[int]
    shm_files: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["launch"] = self.launch.to_json()
        return doc


@dataclass(frozen=True)
class LaunchFolder:
    """A launch folder on the node: its group and whether the group's leader is still that
    launch's supervisor."""

    dir: str
    launch_id: str | None
    pgid: int | None
    leader_alive: bool
    exit_status: str | None


@dataclass(frozen=True)
class Holders:
    """Every process holding a GPU device file or in a launch's group, host memory (bytes),
    /dev/shm files and the node's launch folders."""

    time: float
    processes: list[Process]
    meminfo: dict[str, int]
    shm_files: list[dict[str, Any]]
    launches: list[LaunchFolder]


@dataclass(frozen=True)
class Signalled:
    """After ``signal``: what was signalled, what could not be, what is still alive."""

    signal: str
    sent: list[str]
    errors: list[str]
    remaining: list[Process]


@dataclass(frozen=True)
class Reaped:
    """After ``reap``: the parents sent SIGCHLD and the processes still defunct."""

    signalled_parents: list[int]
    defunct: list[Process]


@dataclass(frozen=True)
class GpuReset:
    """``nvidia-smi --gpu-reset``'s argv, exit status (None: no answer) and exact words."""

    command: list[str]
    exit_status: int | None
    output: str


@dataclass(frozen=True)
class Listening:
    """After ``listen``: whether the node bound a TCP listener on ``port`` (on 0.0.0.0, and on
    :: where the node has IPv6); it accepts and closes connections, detached, for the seconds
    asked. ``error`` is the bind's OSError words (``Address already in use``) when it did not."""

    listening: bool
    port: int
    error: str | None = None


@dataclass(frozen=True)
class Reached:
    """After ``reach``: whether one TCP connect from the node to the host and port asked about
    succeeded; ``error`` the OSError's words when not (``timed out``, ``[Errno 111] Connection
    refused``, ``[Errno 113] No route to host``, a name that does not resolve); ``elapsed_s``
    the seconds the attempt took (resolving the name included)."""

    reached: bool
    error: str | None
    elapsed_s: float


def _masked(doc: Any) -> Any:
    """``doc`` with the secrets a process's command line spells out masked (``--api-key …``,
    ``PASSWORD=…``, URL passwords): command lines of every process on a node (another user's
    included) are shown on pages, in cleanups and in bundles."""
    if isinstance(doc, dict):
        return {
            k: mask_assignments(v) if k == "command" and isinstance(v, str) else _masked(v)
            for k, v in doc.items()
        }
    if isinstance(doc, list):
        return [_masked(v) for v in doc]
    return doc


def _answer(kind: type[T], text: str, what: str) -> T:
    """The last line of ``text`` read as ``kind``; ``RemoteError`` when it cannot be."""
    try:
        doc = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        detail = str(exc).splitlines()[0][:200] if str(exc) else "no answer"
        raise ssh.RemoteError(
            "command_failed", f"{what} printed no usable answer ({detail})"
        ) from None
    return _validated(kind, doc, what)


def _validated(kind: type[T], doc: Any, what: str) -> T:
    """``doc`` (a parsed answer, command lines masked) read as ``kind``; ``RemoteError`` when it
    cannot be."""
    try:
        return TypeAdapter(kind).validate_python(_masked(doc))
    except ValidationError as exc:
        detail = str(exc).splitlines()[0][:200] if str(exc) else "no answer"
        raise ssh.RemoteError(
            "command_failed", f"{what} printed no usable answer ({detail})"
        ) from None


def _call(
    conn: ssh.Connection,
    kind: type[T],
    command: str,
    *args: str,
    stdin: bytes | None = None,
    timeout: float = ssh.COMMAND_TIMEOUT_S,
) -> T:
    result = ssh.run(conn, ["python3", "-c", AGENT, command, *args], stdin=stdin, timeout=timeout)
    return _answer(kind, result.stdout, f"the node agent's {command}")


#: Nodes (address, port, user) whose python3 had no ``pynvml`` when this process last asked:
#: their NVML readings go with the panel's copy from then on (one extra round trip per node
#: and worker process, instead of 50 kB on every heartbeat of every node).
_WITHOUT_PYNVML: set[tuple[Any, ...]] = set()


def _node_key(conn: ssh.Connection) -> tuple[Any, ...]:
    transport = conn.get_transport()
    if transport is None:
        return ()
    return (*transport.getpeername()[:2], transport.get_username())


def _agent(
    conn: ssh.Connection, command: str, *args: str, pynvml: bool | None = None
) -> tuple[list[str], bytes | None]:
    """The agent's argv for ``command`` and its stdin: the panel's pynvml.py (``--pynvml``)
    when ``pynvml`` is true, or (None) when this node is known to lack its own."""
    send = _node_key(conn) in _WITHOUT_PYNVML if pynvml is None else pynvml
    module = shipped.pynvml() if send else None
    if module is None:
        return ["python3", "-c", AGENT, command, *args], None
    return ["python3", "-c", AGENT, "--pynvml", command, *args], module.payload


def _lacks_pynvml(facts: NodeFacts | None) -> bool:
    return bool(facts and facts.pynvml_from is None and facts.nvml_error)


def _read_nvml(
    conn: ssh.Connection,
    command: str,
    args: list[str],
    timeout: float,
    read: Callable[[ssh.Result], tuple[T, NodeFacts | None]],
) -> T:
    """Run an agent ``command`` that reads NVML and parse it with ``read(result)`` (which gives
    ``(answer, facts)``); when the node turns out to have no ``pynvml`` and the panel's copy was
    not sent, remember the node and ask once more with it."""
    argv, stdin = _agent(conn, command, *args)
    result = ssh.run(conn, argv, stdin=stdin, timeout=timeout, check=False)
    answer, facts = read(result)
    if stdin is None and _lacks_pynvml(facts) and shipped.pynvml() is not None:
        _WITHOUT_PYNVML.add(_node_key(conn))
        argv, stdin = _agent(conn, command, *args, pynvml=True)
        answer, _ = read(ssh.run(conn, argv, stdin=stdin, timeout=timeout, check=False))
    return answer


def _no_python(result: ssh.Result) -> None:
    if result.exit_status == 127:
        raise ssh.RemoteError(
            "command_failed", "python3 is not installed on the node", exit_status=127
        )


def probe(
    conn: ssh.Connection, python: str, *, live: bool = False, timeout: float = 60
) -> NodeFacts:
    """The node's GPUs, memory and (unless ``live``) SGLang under ``python``, parsed. NVML is
    read through the node's ``pynvml``, or the panel's nvidia-ml-py where it has none."""

    def read(result: ssh.Result) -> tuple[NodeFacts, NodeFacts | None]:
        _no_python(result)
        try:
            facts = parse_probe(result.stdout)
        except ProbeError as exc:
            tail = result.stderr.strip().splitlines()[-1:] or [""]
            raise ssh.RemoteError(
                "command_failed", f"the probe failed: {exc} {tail[0]}".strip()
            ) from None
        return facts, facts

    args = [*(["--live"] if live else []), python]
    return _read_nvml(conn, "probe", args, timeout, read)


def model_folder(conn: ssh.Connection, path: str, stamp: str | None = None) -> ModelFolder:
    """The model folder at ``path``; only ``unchanged`` when ``stamp`` still holds."""
    return _call(conn, ModelFolder, "model", path, *([stamp] if stamp else []), timeout=60)


def preflight(conn: ssh.Connection, model_path: str, ports: list[int]) -> Preflight:
    """The model folder's presence, /dev/shm and which of ``ports`` are taken."""
    return _call(conn, Preflight, "preflight", model_path or "-", *map(str, ports))


def prepare(
    conn: ssh.Connection,
    folder: str,
    python: str,
    model_path: str,
    stamp: str | None,
    ports: list[int],
) -> Prepared:
    """Everything pre-flight reads on the node in one round trip (see ``Prepared``): the
    group in ``folder``, the probe with SGLang under ``python``, the model folder at
    ``model_path`` (``unchanged`` when ``stamp`` still holds) and which of ``ports`` are taken.
    Raises ``ssh.RemoteError``."""
    argv = [folder, python, model_path or "-", stamp or "-", *map(str, ports)]

    def read(result: ssh.Result) -> tuple[Prepared, NodeFacts | None]:
        _no_python(result)
        found = parse_prepared(result.stdout, result.stderr, result.exit_status)
        return found, found.facts

    found = _read_nvml(conn, "prepare", argv, 60, read)
    return replace(found, ports=tuple(ports))


def parse_prepared(stdout: str, stderr: str = "", exit_status: int | None = 0) -> Prepared:
    """The agent's ``prepare`` answer (its last line of ``stdout``) as ``Prepared``; raises
    ``ssh.RemoteError`` (``command_failed``, with the last line of ``stderr``) when unusable."""
    what = "the node agent's prepare"
    try:
        doc = json.loads(stdout.strip().splitlines()[-1])
        probe = doc.get("probe")
        facts = parse_probe(json.dumps(probe)) if probe is not None else None
    except (ValueError, IndexError, AttributeError, ProbeError) as exc:
        tail = stderr.strip().splitlines()[-1:] or [""]
        raise ssh.RemoteError(
            "command_failed",
            f"{what} printed no usable answer ({str(exc)[:200]}) {tail[0][:200]}".strip(),
            exit_status=exit_status,
        ) from None
    model, read = doc.get("model"), doc.get("preflight")
    return Prepared(
        status=_validated(GroupStatus, doc.get("status"), what),
        facts=facts,
        model=_validated(ModelFolder, model, what) if model else None,
        preflight=_validated(Preflight, read, what) if read else None,
    )


def start(conn: ssh.Connection, folder: str, python: str, request: dict[str, Any]) -> GroupStatus:
    """Start the server in ``folder`` from ``request`` (``args``, ``env``, ``shown_command``,
    ``shown_env``, ``launch_id``, ``run_as``), sent on stdin (it holds secrets)."""
    body = json.dumps(request).encode()
    return _call(conn, GroupStatus, "start", folder, python, stdin=body)


def status(conn: ssh.Connection, folder: str, timeout: float = 60) -> GroupStatus:
    """The launch's group as it is now (a whole read of /proc)."""
    return _call(conn, GroupStatus, "status", folder, timeout=timeout)


def stop(conn: ssh.Connection, folder: str, grace: float, wait: float) -> StopAnswer:
    """SIGTERM the launch's group, ``grace`` s, SIGKILL, ``wait`` s; what remains."""
    result = ssh.run(
        conn,
        ["python3", "-c", AGENT, "stop", folder, str(grace), str(wait)],
        timeout=grace + wait + 20,
    )
    found = _answer(dict, result.stdout, "the node agent's stop")
    return StopAnswer(
        status=TypeAdapter(GroupStatus).validate_python(found),
        signals=list(found.get("signals") or []),
        remaining=list(found.get("remaining") or []),
    )


def snapshot(conn: ssh.Connection, folder: str) -> Snapshot:
    """The node's memory, the launch's group, kernel OOM lines, ports and /dev/shm now."""
    return _call(conn, Snapshot, "snapshot", folder)


def holders(conn: ssh.Connection, pgids: list[int] | None = None) -> Holders:
    """Every GPU holder and launch process on the node, with host memory and /dev/shm."""
    return _call(conn, Holders, "holders", *map(str, pgids or []))


def signal(conn: ssh.Connection, name: str, wait: float, targets: list[str]) -> Signalled:
    """Send SIG``name`` (TERM, KILL) to ``targets`` (``PID@START``, ``PID``, ``-PGID``)."""
    return _call(conn, Signalled, "signal", name, str(wait), *targets, timeout=wait + 60)


def reap(conn: ssh.Connection, wait: float, pids: list[int]) -> Reaped:
    """Have the parents of the defunct ``pids`` collect them, waiting at most ``wait`` s."""
    return _call(conn, Reaped, "reap", str(wait), *map(str, pids), timeout=wait + 60)


def reset(conn: ssh.Connection, index: int) -> GpuReset:
    """``nvidia-smi --gpu-reset -i index`` on the node."""
    return _call(conn, GpuReset, "reset", str(index), timeout=180)


def listen(conn: ssh.Connection, port: int, seconds: float, accept: int = 0) -> Listening:
    """Have the node listen on TCP ``port`` for ``seconds`` (bounded to 1..120 by the agent),
    or until ``accept`` connections came (when given), so that other nodes can ``reach`` it;
    returns once the listener is bound (or could not be), the listener itself detached from
    the SSH command. Raises ``ssh.RemoteError``."""
    more = [str(accept)] if accept else []
    return _call(conn, Listening, "listen", str(port), f"{seconds:g}", *more, timeout=30)


def reach(conn: ssh.Connection, host: str, port: int, timeout: float) -> Reached:
    """Whether the node reaches ``host:port`` (an IPv4 or IPv6 address or a name, resolved on
    the node) in one TCP connect within ``timeout`` s (bounded to 0.1..60 by the agent). Raises
    ``ssh.RemoteError``."""
    # The agent answers within 60 s and the name's resolution: the SSH command's bound is wider.
    return _call(conn, Reached, "reach", host, str(port), f"{timeout:g}", timeout=120)


class Watch:
    """The launch's status as the agent's ``watch`` reports it: a line whenever something
    changed (members, their states, the exit), at least every ``beat`` s: one long-running
    command instead of a status command a second."""

    def __init__(self, conn: ssh.Connection, folder: str, interval: float, beat: float):
        # The panel's pynvml goes along where the node has none: the watch's GPU memory
        # readings are NVML's (once per watch, so always sent where this process has not
        # probed the node yet; the agent imports it only when the node lacks its own).
        argv, stdin = _agent(conn, "watch", folder, str(interval), str(beat), pynvml=True)
        self._stream = ssh.stream(conn, argv, stdin=stdin)
        self._buffer = b""
        self._heard = time.monotonic()
        self.latest: GroupStatus | None = None

    def poll(self, timeout: float = 0) -> GroupStatus | None:
        """The newest status that arrived within ``timeout`` s (None: nothing new). Raises
        ``RemoteError`` when the watch ended or its connection broke."""
        data = self._stream.read(timeout)
        if data is None:
            raise ssh.RemoteError("unreachable", "the node agent's watch ended")
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        fresh = None
        for line in filter(bytes.strip, lines):
            fresh = _answer(GroupStatus, line.decode(errors="replace"), "the watch")
        if fresh is not None:
            self.latest, self._heard = fresh, time.monotonic()
        return fresh

    def quiet_for(self) -> float:
        """Seconds since the watch last said anything."""
        return time.monotonic() - self._heard

    def close(self) -> None:
        self._stream.close()
