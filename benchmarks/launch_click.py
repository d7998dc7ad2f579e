"""Click → server process on the node (issue 21, item 3): ``--launches`` (20) launches, one after
another, each submitted as the launch form submits it and timed from the submit to the moment the
worker recorded the process started on the node (``Launch.started``, set when the node's agent
answered with the new process's PID). Pre-flight (a fresh probe, the checks, the budget) is
inside that span, and the time to the first ``preflight`` status is printed apart (the queue).

Run as root from the project folder: ``.venv/bin/python benchmarks/launch_click.py``. It brings
up one simulated node of 2 GPUs, the workers as ``./run`` starts them, a temporary SQLite
database and Redis database 13, and tears them down. Target: p95 ≤ 2 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.logstream import REDIS_URL, fleet, percentile, register, sandbox, wait  # noqa: E402

COMMAND = "python3 -m sglang.launch_server --model-path /srv/models/qwen2.5-7b"


def run(sims: list[dict[str, object]], count: int) -> list[str]:
    from django.db.models import Min

    from nodes.management.cli import resolve_actor
    from nodes.models import Launch, Node
    from nodes.models.choices import LaunchStatus, Role
    from nodes.workflows import ending, launching

    actor = resolve_actor(None, Role.OPERATOR)
    node = Node.objects.get(name=str(sims[0]["name"]))
    to_process: list[float] = []
    to_preflight: list[float] = []
    for _ in range(count):
        clicked = time.time()
        launch = launching.submit(node=node, command=COMMAND, gpus=[0], actor=actor)
        seen_preflight = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            row = Launch.objects.values("status", "started").get(pk=launch.pk)
            if seen_preflight is None and row["status"] != LaunchStatus.PENDING:
                seen_preflight = time.time()
            if row["started"] is not None or row["status"] in (
                LaunchStatus.BLOCKED, LaunchStatus.FAILED, LaunchStatus.ERROR
            ):  # fmt: skip
                break
            time.sleep(0.01)
        launch.refresh_from_db()
        if launch.started is None:
            raise SystemExit(f"launch {launch.pk} did not start: {launch.status} {launch.reason}")
        to_process.append(launch.started.timestamp() - clicked)
        to_preflight.append((seen_preflight or clicked) - clicked)
        ending.stop(launch.pk, actor=actor)
        wait(lambda: Launch.objects.get(pk=launch.pk).status == "stopped", 60, "stopped")  # noqa: B023
    first = Launch.objects.aggregate(Min("created"))["created__min"]
    return [
        f"launches: {count} on {node.name}, one after another (first at {first:%H:%M:%S})",
        f"click → process p50: {statistics.median(to_process) * 1000:.0f} ms",
        f"click → process p95: {percentile(to_process, 95) * 1000:.0f} ms",
        f"click → process max: {max(to_process) * 1000:.0f} ms",
        f"click → pre-flight begins (queue) p50: {statistics.median(to_preflight) * 1000:.0f} ms",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--launches", type=int, default=20)
    args = parser.parse_args()
    with sandbox() as box:
        from tests.workers import Workers

        workers = Workers(box.database, REDIS_URL, stream_threads=8)
        try:
            sims = fleet(box.state, 1, 2)
            register(sims)
            workers.start()
            report = run(sims, args.launches)
        finally:
            workers.stop()
    print("\n".join(report))


if __name__ == "__main__":
    main()
