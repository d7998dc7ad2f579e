"""Live log streaming: lines lost and node-write → browser-receive latency, and 20 launches
streaming at once on one worker host while heartbeats keep their interval.

Part 1: one simulated server prints 2,000 lines/s for 30 s (``SGLANG_STANDIN_CHATTER``, each line
carrying its write time in ns). A client follows the endpoint the browser uses (Server-Sent
Events from the ASGI panel, fed by the follower on the `streams` worker through the database and
Redis); beside it, in the same run, a raw ``ssh node tail -F`` of the same file. Both print the
lines lost and the latency at p50/p95. Target: 0 lost, p95 ≤ 300 ms.

Part 2: 20 launches (5 nodes × 4 GPUs) each printing 100 lines/s for 30 s, followed by one
`streams` worker (threads); meanwhile the `default` worker gets a heartbeat every 5 s and each
one's completion time (queue wait + sweep) is measured; every launch's stored log is checked.

Run as root from the project folder: ``.venv/bin/python benchmarks/logstream.py``. It brings a
fleet up in a temporary folder, uses a temporary SQLite database and Redis database 13 of the
local Redis, and tears all of it down.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from tests.panel import Panel

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
REDIS_URL = os.environ.get("RANKWISE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
WRITTEN = re.compile(r"#token: (\d+),.*written_ns=(\d+)")
MODEL = "--model-path /srv/models/qwen2.5-7b"


def number(pattern: re.Pattern[str] | str, text: str, group: int = 1) -> int:
    match = re.search(pattern, text)
    if match is None:
        raise SystemExit(f"no {pattern} in {text!r}")
    return int(match[group])


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


@dataclass(frozen=True)
class Sandbox:
    """A benchmark's own world: its folder, the simulated fleet's state folder in it, and a
    SQLite database URL there."""

    work: Path
    state: str
    database: str


@contextmanager
def sandbox() -> Iterator[Sandbox]:
    """A temporary folder with a SQLite database and Redis database ``REDIS_URL`` (emptied),
    Django set up on them; on the way out the fleet started in ``state`` is taken down and the
    folder removed."""
    with tempfile.TemporaryDirectory(prefix="rankwise-bench-") as tmp:
        work = Path(tmp)
        found = Sandbox(work, str(work / "fleet"), f"sqlite:///{work / 'bench.sqlite3'}")
        os.environ.update(
            DATABASE_URL=found.database, RANKWISE_STATE_DIR=str(work / "var"), REDIS_URL=REDIS_URL
        )
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
        import django

        django.setup()
        import redis

        redis.Redis.from_url(REDIS_URL).flushdb()
        try:
            yield found
        finally:
            subprocess.run(
                [sys.executable, "-m", "simfleet", "down", "--state", found.state], cwd=ROOT
            )


def fleet(state: str, nodes: int, gpus: int) -> list[dict[str, object]]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "simfleet",
            "up",
            "--nodes",
            str(nodes),
            "--gpus",
            str(gpus),
            "--gpu-memory",
            "80GiB",
            "--speed",
            "8",
            "--state",
            state,
            "--json",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return list(json.loads(out)["nodes"])


def register(sims: list[dict[str, object]]) -> None:
    """As the heartbeat benchmark registers its fleet, then a discovery of each node and the
    panel's admin (the CLI's operator)."""
    from django.core.management import call_command

    from benchmarks.heartbeat import register as register_fleet
    from nodes.models import Node
    from nodes.workflows.discovery import discover

    register_fleet(sims)
    call_command("ensure_admin", verbosity=0, stdout=io.StringIO())
    for node in Node.objects.all():
        discover(node.pk)


def raw_tail(
    sim: dict[str, object], path: str, stop: threading.Event, out: list[tuple[int, int, int]]
) -> None:
    """``ssh node tail -F FILE``: (count, written_ns, received_ns) per decode line."""
    import paramiko

    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # the fleet made the key
    client.connect(
        str(sim["host"]),
        username="root",
        key_filename=str(sim["key_path"]),
        allow_agent=False,
        look_for_keys=False,
    )
    transport = client.get_transport()
    assert transport is not None
    channel = transport.open_session()
    channel.exec_command(shlex.join(["tail", "-n", "+1", "-F", path]))
    channel.settimeout(0.5)
    buffer = b""
    while not stop.is_set():
        try:
            data = channel.recv(1 << 16)
        except TimeoutError:
            continue
        if not data:
            break
        now = time.time_ns()
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            match = WRITTEN.search(line.decode(errors="replace"))
            if match:
                out.append((int(match[1]), int(match[2]), now))
    client.close()


def summarise(name: str, rows: list[tuple[int, int, int]], total: int, since_ns: int) -> str:
    counts = [c for c, _, _ in rows]
    unique = set(counts)
    lost = total - len(unique & set(range(1, total + 1)))
    duplicates = len(counts) - len(unique)
    delays = [(r - w) / 1e6 for _, w, r in rows if w >= since_ns]
    return (
        f"{name}: {len(unique)}/{total} lines, lost {lost}, duplicates {duplicates}; latency "
        f"p50 {percentile(delays, 50):.1f} ms, p95 {percentile(delays, 95):.1f} ms, "
        f"max {max(delays):.1f} ms ({len(delays)} lines measured)"
    )


def wait(predicate: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def part_one(panel: Panel, sims: list[dict[str, object]], seconds: int, rate: int) -> list[str]:
    from nodes.management.cli import resolve_actor
    from nodes.models import Launch, LaunchLogLine, Node
    from nodes.models.choices import Role
    from nodes.workflows import ending, launching
    from nodes.workflows.launching import adhoc_revision
    from tests.sse import follow

    actor = resolve_actor(None, Role.OPERATOR)
    node = Node.objects.get(name=str(sims[0]["name"]))
    command = (
        f"SGLANG_STANDIN_CHATTER={rate} SGLANG_STANDIN_CHATTER_SECONDS={seconds} "
        "SGLANG_STANDIN_CHATTER_STAMPS=1 "
        f"SGLANG_STANDIN_CHATTER_AFTER=6 python3 -m sglang.launch_server {MODEL}"
    )
    launch = launching.submit(node=node, revision=adhoc_revision(command, node, actor), actor=actor)
    wait(lambda: Launch.objects.get(pk=launch.pk).status == "ready", 120, "ready")
    launch.refresh_from_db()
    stop = threading.Event()
    raw: list[tuple[int, int, int]] = []
    sse: list[tuple[int, str, int]] = []
    attach = time.time_ns()
    tail = threading.Thread(
        target=raw_tail, args=(sims[0], f"{launch.remote_dir}/server.log", stop, raw)
    )
    reader = threading.Thread(
        target=lambda: sse.extend(
            follow(
                f"{panel.url}/launches/{launch.pk}/events/",
                panel.cookie_for(actor),
                time.monotonic() + seconds + 180,
            )
        )
    )
    tail.start()
    reader.start()
    done = wait(
        lambda: LaunchLogLine.objects.filter(launch=launch, text__contains="batches done").first(),
        seconds + 120,
        "the end of the chatter",
    )
    total = number(r"done: (\d+) lines", done.text)
    ending.stop(launch.pk, actor=actor)
    reader.join(120)
    stop.set()
    tail.join(10)
    rows = []
    for _, text, received in sse:
        match = WRITTEN.search(text)
        if match:
            rows.append((int(match[1]), int(match[2]), received))
    return [
        f"part 1: {rate} lines/s for {seconds} s, one launch",
        summarise("  live endpoint (SSE via the panel)", rows, total, attach + 2 * 10**9),
        summarise("  raw ssh tail -F (same run)", raw, total, attach + 2 * 10**9),
    ]


def part_two(
    sims: list[dict[str, object]], launches_count: int, seconds: int, rate: int
) -> list[str]:
    from controlpanel.celery import app
    from nodes.management.cli import resolve_actor
    from nodes.models import Launch, LaunchLogLine, Node
    from nodes.models.choices import Role
    from nodes.workflows import ending, launching

    actor = resolve_actor(None, Role.OPERATOR)
    nodes = list(Node.objects.order_by("name"))
    idle = []
    for _ in range(3):
        sent = time.monotonic()
        app.send_task("nodes.heartbeat").get(timeout=60)
        idle.append(time.monotonic() - sent)
    made = []
    for i in range(launches_count):
        node = nodes[i % len(nodes)]
        command = (
            f"SGLANG_STANDIN_CHATTER={rate} SGLANG_STANDIN_CHATTER_SECONDS={seconds} "
            "SGLANG_STANDIN_CHATTER_STAMPS=1 "
            f"SGLANG_STANDIN_CHATTER_AFTER=10 python3 -m sglang.launch_server {MODEL} "
            f"--port {30000 + i // len(nodes)}"
        )
        made.append(launching.submit(node=node, command=command, actor=actor))
    wait(
        lambda: Launch.objects.filter(status="ready").count() == launches_count,
        240,
        f"{launches_count} launches ready",
    )
    beats = []
    started = time.monotonic()
    while time.monotonic() - started < seconds + 10:
        sent = time.monotonic()
        app.send_task("nodes.heartbeat").get(timeout=60)
        beats.append(time.monotonic() - sent)
        time.sleep(max(0.0, 5 - (time.monotonic() - sent)))

    def ended(launch: Launch) -> LaunchLogLine | None:
        return LaunchLogLine.objects.filter(launch=launch, text__contains="batches done").first()

    lost = 0
    for launch in made:
        done = wait(functools.partial(ended, launch), 120, "every launch's chatter to end")
        total = number(r"done: (\d+) lines", done.text)
        texts = LaunchLogLine.objects.filter(launch=launch, text__contains="Decode batch,")
        counts = {number(WRITTEN, t) for t in texts.values_list("text", flat=True)}
        lost += total - len(counts)
    for launch in made:
        ending.stop(launch.pk, actor=actor)
    return [
        f"part 2: {launches_count} launches × {rate} lines/s for {seconds} s on one streams worker",
        f"  lines lost over all launches: {lost}",
        f"  heartbeat every 5 s while streaming: {len(beats)} sweeps of {len(nodes)} nodes, "
        f"completion median {statistics.median(beats):.2f} s, max {max(beats):.2f} s "
        f"(idle before: median {statistics.median(idle):.2f} s)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--many-rate", type=int, default=100)
    args = parser.parse_args()
    with sandbox() as box:
        from tests.panel import start_panel
        from tests.workers import Workers

        workers = Workers(box.database, REDIS_URL, stream_threads=32)
        panel = None
        report: list[str] = []
        try:
            sims = fleet(box.state, 5, 4)
            register(sims)
            workers.start()
            panel = start_panel(box.database, REDIS_URL, box.work)
            report += part_one(panel, sims, args.seconds, args.rate)
            if args.launches:  # --launches 0: part 1 alone
                report += part_two(sims, args.launches, args.seconds, args.many_rate)
        finally:
            if panel is not None:
                panel.proc.kill()
            workers.stop()
    print("\n".join(report))


if __name__ == "__main__":
    main()
