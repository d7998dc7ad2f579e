"""A redis-server of a test's own, which the test can stop and restart."""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
from pathlib import Path

import redis

from tests.fleet import wait_until

_prctl = ctypes.CDLL(None).prctl
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the process that started it dies, so that a test
    run killed outright leaves no Redis, worker or panel behind (Linux's PR_SET_PDEATHSIG)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # looked up beforehand: a forked child of a
    # threaded process must not load libraries or take locks before exec


class OwnRedis:
    """A redis-server of the test's own, on a free port, that the test can restart."""

    def __init__(self, logs: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.logs = logs
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=open(self.logs / "redis.log", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        assert wait_until(lambda: self._answers(), 10), "redis-server did not start"

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.kill()  # waits until the old server has gone, its port free again
        self.start()
