"""The main process of the stand-in: checks, spawns ranks, waits for them, serves HTTP (§4–§5)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn

from simnode import state

import sglang
from sglang._standin import args as flags
from sglang._standin import http, scheduler
from sglang._standin.launch import Launch, leak_on_crash
from sglang._standin.log import Log
from sglang._standin.memory import load_model

log = Log()


def main() -> None:
    version = flags.version_key(sglang.__version__)
    ns = flags.parse(sglang.__version__, sys.argv[1:])
    log(f"server_args=ServerArgs({', '.join(f'{k}={v!r}' for k, v in sorted(vars(ns).items()))})")
    launch = _prepare(ns, version)
    if version <= (0, 5, 9):
        state.set_title("sglang::http_server/tokenizer_manager")
    signal.signal(signal.SIGQUIT, _on_sigquit)
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, _on_sigterm)
    if launch.node_rank == 0:
        # Nodes of rank ≥ 1 run no tokenizer or detokenizer (engine.py @0.5.9 :1040).
        _CHILDREN.append(_spawn_detokenizer())
    pipes = []
    for rank in range(launch.ranks):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            scheduler.run(launch, rank, write_fd)
        os.close(write_fd)
        launch.rank_pids.append(pid)
        _CHILDREN.append(pid)
        pipes.append(read_fd)
    ready = _wait_for_ranks(launch, pipes)
    if launch.node_rank > 0:
        _serve_dummy_health(launch)
        return
    http.serve(launch, ready, log, on_crash=_crash)


def _serve_dummy_health(launch: Launch) -> None:
    """A node of rank ≥ 1 once its ranks are ready: a /health that always answers 200, then
    waiting on its ranks (engine.py @0.5.9 :1040-1060, utils/common.py :2656-2712)."""
    host = str(launch.flag("host", default="127.0.0.1"))
    port = int(launch.flag("port", default=30000))
    paths = {"/health", "/health_generate"} | ({"/ping"} if launch.version >= (0, 5, 9) else set())

    class Dummy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200 if self.path.split("?")[0] in paths else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    try:
        server = ThreadingHTTPServer((host, port), Dummy)
    except OSError as exc:
        log(f"Dummy health check server failed to start: {exc}")
    else:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        if launch.version <= (0, 5, 2):
            log(f"Starting dummy health check server at {host}:{port}")
        else:
            log(f"Dummy health check server started in background thread at {host}:{port}")
    for pid in launch.rank_pids:
        code = _exit_code(pid)
        log(f"Scheduler or DataParallelController {pid} terminated with {code}")


_CHILDREN: list[int] = []


def _fail(kind: str, message: str) -> NoReturn:
    log.raw(
        "Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.11/dist-packages/sglang/launch_server.py", line 14, '
        "in <module>\n    launch_server(server_args)\n"
        f"{kind}: {message}\n"
    )
    sys.exit(1)


def _prepare(ns: Any, version: tuple[int, ...]) -> Launch:
    try:
        model = load_model(ns.model_path)
    except OSError as exc:
        _fail("OSError", str(exc))
    tp = int(flags.get(ns, "tp_size", "tensor_parallel_size", default=1))
    pp = int(flags.get(ns, "pp_size", "pipeline_parallel_size", default=1))
    nnodes = int(flags.get(ns, "nnodes", default=1))
    if flags.get(ns, "disable_radix_cache", default=False) and flags.get(
        ns, "enable_hierarchical_cache", default=False
    ):
        _fail(
            "ValueError",
            "The arguments enable-hierarchical-cache and disable-radix-cache are mutually "
            "exclusive and cannot be used at the same time. Please use only one of them.",
        )
    if (tp * pp) % nnodes:
        _fail("AssertionError", "tp_size must be divisible by number of nodes")
    heads = int(model.text.get("num_attention_heads", tp))
    if heads % tp:
        _fail(
            "ValueError",
            f"Total number of attention heads ({heads}) must be divisible by tensor parallel "
            f"size ({tp}).",
        )
    ranks = tp * pp // nnodes
    node_rank = int(flags.get(ns, "node_rank", default=0))
    # engine.py @0.5.9 :925-946: the TP ranks of this node.
    per_group = max(nnodes // pp, 1)
    first_rank = (tp // per_group) * (node_rank % per_group)
    address = str(flags.get(ns, "dist_init_addr", default="") or "")
    if nnodes > 1 and not address:
        # Without it torch meets at tcp://127.0.0.1:<nccl port>: each node waits for itself.
        address = f"127.0.0.1:{int(flags.get(ns, 'nccl_port', default=0) or 29500)}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    physical = list(range(len(state.config()["gpus"])))
    if visible is not None:
        try:
            physical = [int(v) for v in visible.split(",") if v.strip()]
        except ValueError:
            physical = []
    base = int(flags.get(ns, "base_gpu_id", default=0))
    step = int(flags.get(ns, "gpu_id_step", default=1))
    device_ids = [base + rank * step for rank in range(ranks)]
    if not physical or max(device_ids) >= len(physical):
        _fail(
            "RuntimeError",
            "CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously "
            "reported at some other API call, so the stacktrace below might be incorrect.",
        )
    return Launch(
        ns=ns,
        version=version,
        model=model,
        tp=tp,
        pp=pp,
        nnodes=nnodes,
        ranks=ranks,
        node_rank=node_rank,
        first_rank=first_rank,
        dist_init_addr=address,
        dist_timeout=float(flags.get(ns, "dist_timeout", default=None) or 600),
        gpu_ids=[physical[d] for d in device_ids],
        device_ids=device_ids,
        barrier_dir=tempfile.mkdtemp(prefix="sglang-standin-"),
        main_pid=os.getpid(),
        speed=state.speed(),
        leak=leak_on_crash(),
    )


def _spawn_detokenizer() -> int:
    pid = os.fork()
    if pid == 0:
        state.die_with_parent()
        state.set_title("sglang::detokenizer")
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            time.sleep(3600)
    return pid


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _wait_for_ranks(launch: Launch, pipes: list[int]) -> list[dict[str, Any]]:
    """≤ 0.5.9: block on each rank's pipe in order; ≥ 0.5.12: poll all of them every 5 s."""
    buffers = [b""] * len(pipes)
    ready: list[dict[str, Any] | None] = [None] * len(pipes)
    if launch.version <= (0, 5, 9):
        for rank, fd in enumerate(pipes):
            while b"\n" not in buffers[rank]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    code = _exit_code(launch.rank_pids[rank])
                    log(f"Rank {rank} scheduler is dead. Please check if there are relevant logs.")
                    log(f"Exit code: {code}")
                    _crash("Initialization failed. Please see the error messages above.")
                buffers[rank] += chunk
            ready[rank] = json.loads(buffers[rank])
        return [r for r in ready if r is not None]
    while any(r is None for r in ready):
        waiting = [fd for rank, fd in enumerate(pipes) if ready[rank] is None]
        readable, _, _ = select.select(waiting, [], [], 5.0 / launch.speed)
        for fd in readable:
            rank = pipes.index(fd)
            chunk = os.read(fd, 4096)
            buffers[rank] += chunk
            if b"\n" in buffers[rank]:
                ready[rank] = json.loads(buffers[rank])
        for rank, pid in enumerate(launch.rank_pids):
            if ready[rank] is not None:
                continue
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                log(
                    f"Rank {rank} scheduler died during initialization (exit code: {code}). If "
                    "exit code is -9 (SIGKILL), a common cause is the OS OOM killer. Run "
                    "`dmesg -T | grep -i oom` to check."
                )
                _crash("Initialization failed.")
    return [r for r in ready if r is not None]


def _crash(reason: str) -> NoReturn:
    """Tear the tree down the way kill_process_tree does: SIGKILL every child, then itself."""
    log(reason)
    if state.has_fault("stuck-on-kill"):
        # Ranks that pinned host memory get stuck in D while the kill unpins it.
        for pid in _CHILDREN:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(0.3)
    for pid in _CHILDREN:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(137)


def _on_sigquit(signum: int, frame: Any) -> None:
    log("Received sigquit from a child process. It usually means the child failed.")
    _crash("Killing the process tree.")


def _on_sigterm(signum: int, frame: Any) -> None:
    threading.Thread(target=_graceful, daemon=True).start()


def _graceful() -> None:
    log.raw("INFO:     Shutting down\n")
    for pid in _CHILDREN:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for pid in _CHILDREN:
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            except ChildProcessError:
                break
            time.sleep(0.02)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    log.raw("INFO:     Finished server process\n")
    os._exit(0)
