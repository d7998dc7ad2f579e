"""Celery workers as separate processes, so a test can kill one mid-task and start it again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis
from celery.app.control import Control

from tests.redis_server import die_with_parent

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
            preexec_fn=die_with_parent,
        )

    def start(self, *queues: str) -> None:
        for queue in queues or ("default", "streams"):
            self._start(queue)
        self.wait_ready(len(self.procs))

    def wait_ready(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self._control().ping(timeout=0.5) or []) >= count:
                return
            time.sleep(0.3)
        raise AssertionError(f"workers did not answer: see {self.logs}")

    def _control(self) -> Control:
        from celery import Celery

        # Not the current app: AsyncResult() and the like must keep finding the panel's.
        return Celery(broker=self.broker_url, set_as_current=False).control

    def _names(self) -> dict[str, str]:
        """Each running worker's node name (``default-PID@host``) by its queue."""
        return {
            name.split("-", 1)[0]: name
            for reply in self._control().ping(timeout=1) or []
            for name in reply
        }

    def _consume(self, on: bool) -> None:
        """Start or stop taking tasks from each worker's queue (the process stays up)."""
        control = self._control()
        for queue, name in self._names().items():
            change = control.add_consumer if on else control.cancel_consumer
            change(queue, destination=[name], reply=True, limit=1, timeout=5)

    def _purge_queues(self) -> None:
        """Drop the tasks that tests without workers queued: nobody was there to run them."""
        broker = redis.Redis.from_url(self.broker_url)
        for queue in ("default", "streams"):
            broker.delete(queue, *broker.scan_iter(match=f"{queue}\x06\x16*"))

    def _idle(self) -> bool:
        """Every worker alive and holding no task: none running, prefetched or waiting for its
        ETA (a retry)."""
        if len(self.procs) < 2 or any(p.poll() is not None for p in self.procs.values()):
            return False
        inspect = self._control().inspect(timeout=5, limit=len(self.procs))
        for held in (inspect.active(), inspect.reserved(), inspect.scheduled()):
            if held is None or len(held) < len(self.procs) or any(held.values()):
                return False
        return True

    def start_missing(self) -> None:
        """A test's start: queues emptied, both workers up and taking tasks."""
        self._purge_queues()
        missing = [q for q in ("default", "streams") if q not in self.procs]
        for queue in missing:
            self._start(queue)
        self.wait_ready(2)
        self._consume(True)

    def settle(self) -> None:
        """A test's end: the workers take no more tasks; if any still holds one (or died), both
        are killed with what they hold and started afresh, so nothing of this test runs on into
        the next."""
        self._consume(False)
        if self._idle():
            return
        self.stop()
        self.start()
        self._consume(False)

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
