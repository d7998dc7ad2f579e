"""Twenty running servers under load, followed by the workers: their metrics sampled at the
follower's pace, their launch pages (with the load plots and the bottleneck) served quickly,
while the heartbeat sweep still fits its interval (issue 20).

Run as root from the project folder, with PostgreSQL and Redis as for the tests:
``.venv/bin/python -m benchmarks.capacity_follow [--nodes 10] [--seconds 120]``.
It brings up ``--nodes`` simulated nodes of 2 GPUs in a temporary folder, a fresh PostgreSQL
database ``rankwise_bench`` and Celery workers as ``./run`` starts them (a ``default`` and a
thread-pool ``streams`` worker, Redis database 8), launches one qwen2.5-7b server per GPU with
``--enable-metrics``, drives ``simfleet load`` at each for ``--seconds``, and meanwhile sweeps
the heartbeat every 30 s and reads every launch page every 10 s. It prints the figures and
tears everything down. Targets: every server keeps a sample at least every 10 s (the stored
spacing is 5 s), every sweep well inside the 30 s interval, page reads under 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "rankwise_bench"
BROKER = "redis://127.0.0.1:6379/8"
COMMAND = (
    "python3 -m sglang.launch_server --model-path /srv/models/qwen2.5-7b --enable-metrics "
    "--max-total-tokens 40000"
)


def _fresh_database() -> str:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as db:
        db.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        db.execute(f"CREATE DATABASE {DATABASE}")
    return f"postgres://postgres@127.0.0.1:5432/{DATABASE}"


def _progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--concurrency", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rankwise-bench-") as tmp:
        work = Path(tmp)
        state = str(work / "fleet")
        url = _fresh_database()
        os.environ.update(
            DATABASE_URL=url, RANKWISE_STATE_DIR=str(work / "var"), REDIS_URL=BROKER,
            CELERY_BROKER_URL=BROKER, RANKWISE_HEALTH_SECONDS="5",
        )  # fmt: skip
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from benchmarks.heartbeat import register
        from tests.workers import Workers

        spec = work / "spec.json"
        spec.write_text(
            '{"nodes": ['
            + ",".join(
                f'{{"name": "b{i:02d}", "gpus": 2, "gpu_memory": "80GiB", "host_ram": "200GB", '
                f'"speed": 2}}'
                for i in range(args.nodes)
            )
            + "]}"
        )
        up = subprocess.run(
            [sys.executable, "-m", "simfleet", "up", "--spec", str(spec), "--state", state,
             "--json"], cwd=ROOT, check=True, capture_output=True, text=True,
        )  # fmt: skip
        nodes = list(json.loads(up.stdout)["nodes"])
        # As many follower threads as ./run gives the streams worker: one per followed launch.
        workers = Workers(url, BROKER, stream_threads=32)
        workers.env["RANKWISE_HEALTH_SECONDS"] = "5"
        try:
            register(nodes)
            _progress(f"{len(nodes)} nodes up and registered; starting workers")
            workers.start()
            _progress("workers started")
            report = _run(nodes, state, args)
        finally:
            _stop_all()
            workers.stop()
            subprocess.run([sys.executable, "-m", "simfleet", "down", "--state", state], cwd=ROOT)
    for line in report:
        print(line)


def _stop_all() -> None:
    from nodes.management.cli import resolve_actor
    from nodes.models import Launch
    from nodes.models.choices import LaunchStatus, Role
    from nodes.workflows import ending

    actor = resolve_actor(None, Role.ADMIN)
    for launch in Launch.objects.exclude(status__in=[LaunchStatus.STOPPED, LaunchStatus.FAILED]):
        try:
            ending.stop(launch.pk, actor=actor)
        except Exception as exc:  # noqa: BLE001 — tearing down: report and go on
            print(f"stop #{launch.pk}: {exc}")


def _run(nodes: list[dict[str, object]], state: str, args: argparse.Namespace) -> list[str]:
    from django.contrib.auth.models import User
    from django.test import Client

    from nodes.management.cli import resolve_actor
    from nodes.models import Launch, Node
    from nodes.models.choices import LaunchStatus, Role
    from nodes.services import capacity
    from nodes.workflows import discovery, launching
    from nodes.workflows.discovery import heartbeat_sweep

    actor = resolve_actor(None, Role.ADMIN)
    for node in Node.objects.all():
        discovery.discover(node.pk)
    _progress("discovered; submitting launches")
    launches = [
        launching.submit(node=node, command=COMMAND, gpus=[gpu], port=30000 + gpu, actor=actor)
        for node in Node.objects.order_by("name")
        for gpu in (0, 1)
    ]
    started = time.monotonic()
    submitted = [x.pk for x in launches]
    settled = {LaunchStatus.READY, LaunchStatus.FAILED, LaunchStatus.BLOCKED}
    seen: set[str] = set()
    while time.monotonic() - started < 600:
        statuses = dict(Launch.objects.filter(pk__in=submitted).values_list("pk", "status"))
        if set(statuses.values()) <= settled:
            break
        if set(statuses.values()) != seen:
            seen = set(statuses.values())
            _progress(f"waiting for readiness: {sorted(seen)}")
        time.sleep(1)
    ready = [x for x in launches if statuses[x.pk] == LaunchStatus.READY]
    if len(ready) < len(launches):
        raise SystemExit(f"only {len(ready)} of {len(launches)} launches became ready")
    ready_s = time.monotonic() - started
    _progress(f"all {len(ready)} ready after {ready_s:.0f} s; loading")

    def load(launch: Launch) -> None:
        subprocess.run(
            [sys.executable, "-m", "simfleet", "load", launch.node.name, f"--port={launch.port}",
             f"--concurrency={args.concurrency}", "--input-tokens=2000", "--output-tokens=200",
             f"--seconds={args.seconds}", "--state", state],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip

    loads = [threading.Thread(target=load, args=(x,)) for x in ready]
    for thread in loads:
        thread.start()
    client = Client(HTTP_HOST="localhost")
    client.force_login(User.objects.get(pk=actor.pk))
    sweeps: list[float] = []
    pages: list[float] = []
    begun = time.monotonic()
    next_sweep = begun
    named: dict[int, str] = {}
    while time.monotonic() - begun < args.seconds:
        if time.monotonic() >= next_sweep:
            wall = time.perf_counter()
            heartbeat_sweep()
            sweeps.append(time.perf_counter() - wall)
            next_sweep += 30
        for launch in ready:
            wall = time.perf_counter()
            answer = client.get(f"/launches/{launch.pk}/")
            pages.append(time.perf_counter() - wall)
            assert answer.status_code == 200, answer.status_code
        # Named while the load runs (once it ends the servers idle and the answer is "none").
        named = {
            x.pk: capacity.bottleneck_of(Launch.objects.get(pk=x.pk)).bottleneck for x in ready
        }
        time.sleep(max(0.0, 10 - (time.monotonic() - begun) % 10))
    for thread in loads:
        thread.join()
    gaps, bottlenecks, points = [], [], []
    for launch in ready:
        launch.refresh_from_db()
        series = [s for s in launch.metrics_series if s.get("num_queue_reqs") is not None]
        times = [float(s["t"]) for s in series]
        window = [t for t in times if t >= times[-1] - args.seconds + 10]
        gaps.append(max(b - a for a, b in zip(window, window[1:], strict=False)))
        points.append(len(series))
        bottlenecks.append(named[launch.pk])
    # The first read of a fresh process loads the templates; a panel serving pages is warm.
    cold, pages = pages[0], pages[1:]
    return [
        f"nodes: {len(nodes)}, servers: {len(ready)} (all ready {ready_s:.0f} s after submit), "
        f"load: {args.concurrency} clients each for {args.seconds:.0f} s",
        f"metrics: widest gap between stored samples under load, worst server "
        f"{max(gaps):.1f} s (median {statistics.median(gaps):.1f} s); samples per server "
        f"{min(points)}–{max(points)}",
        "bottleneck named during the load: "
        + ", ".join(f"{b} ×{bottlenecks.count(b)}" for b in sorted(set(bottlenecks))),
        f"heartbeat sweep of {len(nodes)} nodes during the load: "
        f"{', '.join(f'{s:.2f}' for s in sweeps)} s (interval 30 s)",
        f"launch page with plots: {len(pages)} warm reads, median "
        f"{statistics.median(pages) * 1000:.0f} ms, p95 {_percentile(pages, 0.95) * 1000:.0f} ms, "
        f"max {max(pages) * 1000:.0f} ms "
        f"(and the process's first read, templates loading: {cold * 1000:.0f} ms)",
    ]


if __name__ == "__main__":
    main()
