"""The ranks of a multi-node launch meet in a TCP store at ``--dist-init-addr``, as torch's
``init_process_group(init_method="tcp://HOST:PORT")`` makes them (simfleet/multinode-sources.md):
global rank 0 serves it on every local address at PORT, every rank (rank 0 too) connects to
HOST:PORT, and the launch's collectives (the stand-in's exchanges) go through it.

A client that cannot connect retries until the timeout and then fails with torch's words
(``DistNetworkError: The client socket has timed out after …``); the store's host waits until as
many joins as its own world size were counted (torch counts them, whoever sends them) and fails
with ``DistStoreError: Timed out after … waiting for clients. K/N clients joined.``; a client
whose store goes away fails with ``DistNetworkError: Failed to recv, got 0 bytes. …``. The
protocol between stand-in ranks is JSON lines, one request and one answer each.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from typing import Any


class StoreError(Exception):
    """torch's error as it would be raised: ``kind`` (its Python type), its message, and the
    SGLang source file (under ``sglang/srt/``) the traceback ends in."""

    def __init__(
        self, kind: str, message: str, where: str = "distributed/parallel_state.py"
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.where = where


class StoreGone(StoreError):
    """The store's host went away under a request; ``warning`` is the line torch logs first."""

    def __init__(self, warning: str) -> None:
        super().__init__(
            "torch.distributed.DistNetworkError",
            "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server "
            "shutdown or crash?",
        )
        self.warning = warning


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) → ``(host, port)``."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class Server:
    """The store global rank 0 serves: values by key, and who has joined."""

    def __init__(self, port: int) -> None:
        self.values: dict[str, Any] = {}
        self.joined = 0  # TCPStore's init key: one increment per client, ranks unchecked
        self.lock = threading.Lock()
        try:
            self.sock = socket.create_server(
                ("::", port), family=socket.AF_INET6, dualstack_ipv6=True
            )
        except OSError:
            try:
                self.sock = socket.create_server(("0.0.0.0", port))
            except OSError as exc:
                raise StoreError(
                    "torch.distributed.DistNetworkError",
                    "The server socket has failed to listen on any local network address. "
                    f"port: {port}, useIpv6: false, code: -{exc.errno}, name: EADDRINUSE, "
                    "message: address already in use",
                ) from None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError, ValueError), conn, conn.makefile("rwb") as stream:
            for raw in stream:
                ask = json.loads(raw)
                with self.lock:
                    if "join" in ask:
                        self.joined += 1
                        answer: Any = self.joined
                    elif "set" in ask:
                        self.values[str(ask["set"])] = ask["value"]
                        answer = True
                    elif "get" in ask:
                        answer = [self.values.get(str(k)) for k in ask["get"]]
                    else:
                        keys = [f"{ask['phase']}.{r}" for r in range(int(ask["n"]))]
                        have = [self.values.get(k) for k in keys]
                        answer = None if any(v is None for v in have) else have
                stream.write((json.dumps(answer) + "\n").encode())
                stream.flush()

    def wait_for_workers(self, world: int, timeout: float, shown: float) -> None:
        """Until ``world`` ranks joined; ``DistStoreError`` after ``timeout`` seconds (the error
        says ``shown``, the unscaled figure a real store would print)."""
        started = time.monotonic()
        while True:
            with self.lock:
                joined = self.joined
            if joined >= world:
                return
            if time.monotonic() - started > timeout:
                raise StoreError(
                    "torch.distributed.DistStoreError",
                    f"Timed out after {int(shown) + 1} seconds waiting for clients. "
                    f"{joined}/{world} clients joined.",
                )
            time.sleep(0.02)


class Client:
    """One rank's connection to the store at ``host:port``."""

    def __init__(self, host: str, port: int, timeout: float, shown: float, warn: Any) -> None:
        started = time.monotonic()
        warned = False
        while True:
            try:
                self.sock = socket.create_connection((host, port), timeout=2.0)
                break
            except ConnectionRefusedError:
                pass  # torch retries a refused connection without a word at its default level
            except OSError as exc:
                if not warned and exc.errno is not None:
                    warn(
                        "[W socket.cpp:752] [c10d] The client socket has failed to connect to "
                        f"[{host}]:{port} (errno: {exc.errno} - {exc.strerror})."
                    )
                    warned = True
                elif not warned:
                    warn(f"[W socket.cpp:767] [c10d] The server socket on [{host}]:{port} has "
                         "timed out, will retry.")  # fmt: skip
                    warned = True
            if time.monotonic() - started > timeout:
                raise StoreError(
                    "torch.distributed.DistNetworkError",
                    f"The client socket has timed out after {int(shown)}s while trying to "
                    f"connect to ({host}, {port}).",
                )
            time.sleep(0.1)
        self.sock.settimeout(None)
        self.stream = self.sock.makefile("rwb")
        self.local = _format(self.sock.getsockname())
        self.remote = _format(self.sock.getpeername())

    def ask(self, request: dict[str, Any]) -> Any:
        try:
            self.stream.write((json.dumps(request) + "\n").encode())
            self.stream.flush()
            line = self.stream.readline()
        except OSError:
            line = b""
        if not line:
            # torch's recvBytes when the store's host is gone (Utils.hpp), which TCPStore.cpp
            # logs before it is raised.
            raise StoreGone(
                f"[W TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd="
                f"{self.sock.fileno()}, addr={self.local}, remote={self.remote}): Failed to recv, "
                "got 0 bytes. Connection was likely closed. Did the remote server shutdown or "
                "crash?"
            )
        return json.loads(line)

    def get(self, keys: list[str]) -> list[Any]:
        """The values of ``keys`` (None where not set yet)."""
        return list(self.ask({"get": keys}))

    def set(self, key: str, value: Any) -> None:
        self.ask({"set": key, "value": value})


def _format(address: Any) -> str:
    """``[ip]:port``, as torch prints a socket address it cannot name."""
    return f"[{address[0]}]:{address[1]}"
