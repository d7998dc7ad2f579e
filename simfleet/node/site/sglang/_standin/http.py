"""The stand-in's HTTP server: the endpoints a control panel uses (§5), once ranks are ready."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from simnode import state

import sglang
from sglang._standin.engine import Engine
from sglang._standin.launch import Launch
from sglang._standin.log import Log

MAX_BODY_BYTES = 64 * 2**20


class _State:
    ready = False
    crashed = False


def serve(
    launch: Launch, ranks: list[dict[str, Any]], log: Log, on_crash: Callable[[str], Any]
) -> None:
    host = str(launch.flag("host", default="127.0.0.1"))
    port = int(launch.flag("port", default=30000))  # type: ignore[call-overload]
    first = ranks[0]
    engine = Engine(
        pool_tokens=int(first["max_total_num_tokens"]),
        max_running=int(first["max_running_requests"]),
        max_prefill_tokens=int(first["max_prefill_tokens"]),
        host_tokens=int(first.get("host_tokens", 0)),
        speed=launch.speed,
        log=log,
    )
    handler = _handler(launch, ranks, engine)
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        log(
            f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
            f"('{host}', {port}): {str(exc.strerror).lower()}"
        )
        on_crash("Killing the process tree.")
        return
    server.daemon_threads = True
    log(f"INFO:     Started server process [{os.getpid()}]")
    log("INFO:     Waiting for application startup.")
    log("INFO:     Application startup complete.")
    log(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    launch.sleep(0.3)
    peer = random.randint(40000, 60000)
    log(f'INFO:     {host}:{peer} - "GET /get_model_info HTTP/1.1" 200 OK')
    log(f'INFO:     {host}:{peer + 2} - "POST /generate HTTP/1.1" 200 OK')
    _State.ready = True
    log("The server is fired up and ready to roll!")
    _watch(launch, log)


def _chatter(launch: Launch, log: Log) -> None:
    """Under load SGLang logs a line per decode batch; ``SGLANG_STANDIN_CHATTER=N`` (lines/s, for
    ``SGLANG_STANDIN_CHATTER_SECONDS``, starting ``SGLANG_STANDIN_CHATTER_AFTER`` seconds after
    ready) plays such load, in SGLang's words (the engine's decode-batch line, its ``#token``
    counting the lines). A test or benchmark that measures delivery sets
    ``SGLANG_STANDIN_CHATTER_STAMPS=1``: each line then ends with its write time
    (``written_ns=…``, not SGLang's) and a last line counts them (``Decode batches done: N
    lines``), so a reader can tell a delay and the end."""
    rate = float(os.environ.get("SGLANG_STANDIN_CHATTER", "0") or 0)
    if rate <= 0:
        return
    stamps = os.environ.get("SGLANG_STANDIN_CHATTER_STAMPS", "") == "1"
    seconds = float(os.environ.get("SGLANG_STANDIN_CHATTER_SECONDS", "30") or 30)
    time.sleep(float(os.environ.get("SGLANG_STANDIN_CHATTER_AFTER", "0") or 0))
    started = time.monotonic()
    count = 0
    while time.monotonic() - started < seconds:
        count += 1
        line = (
            f"Decode batch, #running-req: 1, #token: {count}, token usage: 0.01, "
            f"cuda graph: True, gen throughput (token/s): {rate:.2f}, #queue-req: 0, "
        )
        log(line + f"written_ns={time.time_ns()}" if stamps else line)
        delay = started + count / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    if stamps:
        log(f"Decode batches done: {count} lines")


def _watch(launch: Launch, log: Log) -> None:
    """≥ 0.5.12 notices a crashed child within a second; older versions keep serving, unhealthy."""
    threading.Thread(target=_chatter, args=(launch, log), daemon=True).start()
    reaped: set[int] = set()
    while True:
        time.sleep(1.0)
        for pid in launch.rank_pids:
            if pid in reaped:
                continue
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # collected elsewhere already
                reaped.add(pid)
                continue
            if got != pid:
                continue
            reaped.add(pid)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            _State.crashed = True
            if launch.version >= (0, 5, 12):
                log(
                    f"Subprocess scheduler (pid={pid}) crashed with exit code {code}. "
                    "Triggering SIGQUIT for cleanup..."
                )
                os.kill(os.getpid(), signal.SIGQUIT)


def _handler(
    launch: Launch, ranks: list[dict[str, Any]], engine: Engine
) -> type[BaseHTTPRequestHandler]:
    version = launch.version
    model_path = str(launch.ns.model_path)
    served = str(launch.flag("served_model_name") or model_path)
    api_key = launch.flag("api_key")
    started = time.time()

    def server_info() -> dict[str, Any]:
        args = {k: v for k, v in vars(launch.ns).items()}
        args.update(tp_size=launch.tp, pp_size=launch.pp)
        args["mem_fraction_static"] = ranks[0].get("mem_fraction_static")
        memory = {
            "weight": ranks[0]["weight_gib"],
            "kvcache": ranks[0]["kv_gib"],
            "token_capacity": ranks[0]["max_total_num_tokens"],
            "graph": ranks[0]["graph_gib"],
        }
        return {
            **args,
            "status": "ready",
            "max_total_num_tokens": ranks[0]["max_total_num_tokens"],
            "max_req_input_len": ranks[0]["max_req_input_len"],
            "internal_states": [{**args, "memory_usage": memory, "last_gen_throughput": 0.0}],
            "version": sglang.__version__,
        }

    def model_info() -> dict[str, Any]:
        return {
            "model_path": model_path,
            "tokenizer_path": model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
        }

    def metrics() -> str:
        lines = []
        now = engine.gauges()  # TP ranks step together: each reports the same batch
        for rank, info in enumerate(ranks):
            labels = f'model_name="{served}",engine_type="unified",tp_rank="{rank}",pp_rank="0"'
            gauges: dict[str, float] = dict(now)
            if version >= (0, 5, 9):
                gauges["max_total_num_tokens"] = info["max_total_num_tokens"]
            for name, value in gauges.items():
                lines.append(f"# TYPE sglang:{name} gauge")
                lines.append(f"sglang:{name}{{{labels}}} {float(value)}")
            if rank:
                continue  # the tokenizer manager (one per server) counts requests
            for name, total in engine.counters().items():
                lines.append(f"# TYPE sglang:{name} counter")
                lines.append(f"sglang:{name}{{{labels}}} {float(total)}")
            for name, (buckets, summed, count) in engine.histograms().items():
                lines.append(f"# TYPE sglang:{name} histogram")
                for bound, cumulative in buckets:
                    lines.append(
                        f'sglang:{name}_bucket{{{labels},le="{bound}"}} {float(cumulative)}'
                    )
                lines.append(f'sglang:{name}_bucket{{{labels},le="+Inf"}} {float(count)}')
                lines.append(f"sglang:{name}_sum{{{labels}}} {summed}")
                lines.append(f"sglang:{name}_count{{{labels}}} {float(count)}")
        return "\n".join(lines) + "\n"

    class Handler(BaseHTTPRequestHandler):
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def _send(self, status: int, body: str | bytes, kind: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else body
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _json(self, doc: Any) -> None:
            self._send(200, json.dumps(doc))

        def _authorised(self) -> bool:
            if not api_key or self.path.startswith(("/health", "/metrics")):
                return True
            return self.headers.get("Authorization") == f"Bearer {api_key}"

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            if not self._authorised():
                self._send(401, json.dumps({"error": "Unauthorized"}))
            elif path in ("/health", "/health_generate"):
                healthy = _State.ready and not _State.crashed and _ranks_alive(launch)
                self._send(200 if healthy else 503, b"", "text/plain")
            elif path == "/get_model_info" or (path == "/model_info" and version >= (0, 5, 9)):
                self._json(model_info())
            elif path == "/get_server_info" or (path == "/server_info" and version >= (0, 5, 9)):
                self._json(server_info())
            elif path == "/v1/models":
                self._json(
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": served,
                                "object": "model",
                                "created": int(started),
                                "owned_by": "sglang",
                                "root": model_path,
                                "max_model_len": ranks[0]["context_len"],
                            }
                        ],
                    }
                )
            elif path == "/metrics" and launch.flag("enable_metrics", default=False):
                self._send(200, metrics(), "text/plain; version=0.0.4")
            elif path == "/flush_cache":
                self._send(
                    200,
                    "Cache flushed.\nPlease check backend logs for more details. "
                    "(When there are running or waiting requests, the operation will not "
                    "be performed.)\n",
                    "text/plain",
                )
            else:
                self._send(404, json.dumps({"detail": "Not Found"}))

        def do_POST(self) -> None:  # noqa: N802
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY_BYTES:
                self._send(413, json.dumps({"error": {"message": "request body too large"}}))
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except (ValueError, RecursionError):
                body = {}
            body = body if isinstance(body, dict) else {}
            if not self._authorised():
                self._send(401, json.dumps({"error": "Unauthorized"}))
            elif self.path == "/generate" and body.get("input_ids"):
                self._generate(body)
            elif self.path in ("/generate", "/v1/completions"):
                self._json(
                    {
                        "text": " the stand-in does no inference.",
                        "meta_info": {"prompt_tokens": 1, "completion_tokens": 7},
                    }
                )
            elif self.path == "/flush_cache":
                self.do_GET()
            else:
                self._send(404, json.dumps({"detail": "Not Found"}))

        def _generate(self, body: dict[str, Any]) -> None:
            """Token ids in, through the scheduler's queue; the answer once every token is out,
            or an abort when the client goes away (SGLang aborts a disconnected request)."""
            ids = body["input_ids"]
            params = body.get("sampling_params") or {}
            limit = int(ranks[0]["max_req_input_len"])
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                message = "input_ids must be a list of ints"
                self._send(400, json.dumps({"error": {"message": message}}))
                return
            if len(ids) > limit:
                message = (
                    f"The input ({len(ids)} tokens) is longer than the model's context length "
                    f"({limit} tokens)."
                )
                self._send(400, json.dumps({"error": {"message": message}}))
                return
            wanted = params.get("max_new_tokens", 128) if isinstance(params, dict) else None
            if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 0:
                message = "sampling_params.max_new_tokens must be a whole number ≥ 0"
                self._send(400, json.dumps({"error": {"message": message}}))
                return
            # The tokenizer manager's check (_validate_one_request): input and output together
            # within the longest request the server can hold.
            longest = min(
                int(ranks[0]["context_len"]) - 1, int(ranks[0]["max_total_num_tokens"]) - 1
            )
            if len(ids) + wanted > longest:
                message = (
                    f"Requested token count exceeds the model's maximum context length of "
                    f"{longest} tokens. You requested a total of {len(ids) + wanted} tokens: "
                    f"{len(ids)} tokens from the input messages and {wanted} tokens for the "
                    "completion. Please reduce the number of tokens in the input messages or "
                    "the completion to fit within the limit."
                )
                self._send(400, json.dumps({"error": {"message": message}}))
                return
            request = engine.submit(ids, wanted)
            while not request.done.wait(0.2):
                if _gone(self.connection):
                    engine.abort(request)
                    return
            if request.aborted:
                return
            self._json(
                {
                    "text": "",
                    "meta_info": {
                        "prompt_tokens": request.input_len,
                        "completion_tokens": request.generated,
                        "cached_tokens": request.cached_tokens,
                    },
                }
            )

    return Handler


def _gone(connection: socket.socket) -> bool:
    """The client closed its end: the socket reads as end-of-file."""
    readable, _, _ = select.select([connection], [], [], 0)
    if not readable:
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _ranks_alive(launch: Launch) -> bool:
    return all(state.alive(pid) for pid in launch.rank_pids)
