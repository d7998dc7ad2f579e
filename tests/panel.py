"""The panel's web server as `./run` starts it (uvicorn, ASGI), for tests and benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.test import Client

from tests.redis_server import die_with_parent


class Panel:
    """The panel's web server (uvicorn, ASGI, as `./run` starts it) on the test database."""

    def __init__(self, url: str, proc, restart=None) -> None:
        self.url = url
        self.proc = proc
        self._restart = restart

    def cookie_for(self, user) -> str:
        client = Client()
        client.force_login(user)
        return f"sessionid={client.cookies['sessionid'].value}"

    def ensure_running(self) -> None:
        """Start it again (on a new port) if it exited."""
        if self.proc.poll() is not None and self._restart is not None:
            fresh = self._restart()
            self.url, self.proc = fresh.url, fresh.proc

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def start_panel(database: str, redis_url: str, logs: Path) -> Panel:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": database, "REDIS_URL": redis_url}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "controlpanel.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            # As ./run starts it: X-Forwarded-For is not believed without a trusted proxy.
            "--no-proxy-headers",
            "--log-level",
            "warning",
        ],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        stdout=open(logs / "panel.log", "ab"),  # noqa: SIM115 — the process owns it
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return Panel(
                f"http://127.0.0.1:{port}", proc, lambda: start_panel(database, redis_url, logs)
            )
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the panel did not start: see {logs / 'panel.log'}")
