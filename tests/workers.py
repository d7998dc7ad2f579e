"""Celery workers as separate processes, so a test can kill one mid-task and start it again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
# Short intervals so the tests see leases expire, health polls and lost nodes in seconds.
FAST = {
    "RANKWISE_FOLLOWER_LEASE_SECONDS": "4",
    "RANKWISE_LOST_AFTER_SECONDS": "8",
    "RANKWISE_HEALTH_SECONDS": "1",
    "RANKWISE_STOP_GRACE_SECONDS": "5",
    "RANKWISE_KNOWN_GOOD_SECONDS": "4",
    "RANKWISE_STOP_RETRY_SECONDS": "1",
}


class Workers:
    def __init__(self, database_url: str, broker_url: str, stream_threads: int = 16) -> None:
        self.stream_threads = stream_threads
        self.env = {
            **os.environ,
            **FAST,
            "DATABASE_URL": database_url,
            "REDIS_URL": broker_url,
            "CELERY_BROKER_URL": broker_url,
        }
        self.broker_url = broker_url
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"rankwise-workers-{os.getpid()}"
        self.logs.mkdir(exist_ok=True)

    def _start(self, queue: str) -> None:
        pool = [
            "--pool",
            "threads",
            "--concurrency",
            str(self.stream_threads) if queue == "streams" else "4",
        ]
        log = open(self.logs / f"{queue}.log", "ab")  # noqa: SIM115 — the process owns it
        self.procs[queue] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "controlpanel",
                "worker",
                "-Q",
                queue,
                "-n",
                f"{queue}-{os.getpid()}@%h",
                "--loglevel",
                "INFO",
                *pool,
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self, *queues: str) -> None:
        for queue in queues or ("default", "streams"):
            self._start(queue)
        self.wait_ready(len(self.procs))

    def wait_ready(self, count: int, timeout: float = 60) -> None:
        from celery import Celery

        app = Celery(broker=self.broker_url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(app.control.ping(timeout=0.5) or []) >= count:
                return
            time.sleep(0.3)
        raise AssertionError(f"workers did not answer: see {self.logs}")

    def kill(self, queue: str) -> None:
        """SIGKILL the worker and everything it started, as an OOM kill or a crash would."""
        proc = self.procs.pop(queue)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            proc.wait()
        self.procs.clear()
        redis.Redis.from_url(self.broker_url).flushdb()

    def log(self, queue: str) -> str:
        return (self.logs / f"{queue}.log").read_text(errors="replace")
