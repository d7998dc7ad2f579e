"""The live log survives the panel's own faults: a Redis restart mid-stream loses nothing, and
the stream a browser follows (Server-Sent Events) gets every line once, in order."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time

import pytest

from nodes.models import Launch, LaunchLogLine
from nodes.workflows import discovery
from tests.conftest import database_url, manage_py, register_sim_node
from tests.factories import make_user
from tests.fleet import wait_until
from tests.panel import start_panel
from tests.redis_server import OwnRedis
from tests.sse import follow
from tests.workers import Workers

pytestmark = pytest.mark.django_db(transaction=True)
CHATTY = (
    "SGLANG_STANDIN_CHATTER=400 SGLANG_STANDIN_CHATTER_SECONDS=8 SGLANG_STANDIN_CHATTER_STAMPS=1 "
    "python3 -m sglang.launch_server "
    "--model-path /srv/models/qwen2.5-7b --tp-size 2"
)


@pytest.fixture
def own_redis(tmp_path):
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def manage(settings, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return manage_py(settings, *args, env={"REDIS_URL": redis_url}, timeout=300)


def test_restarting_redis_mid_stream_loses_no_line(settings, sim_fleet, own_redis, tmp_path):
    sim = sim_fleet["spare"]
    sim.make_clean()
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    viewer = make_user("vera", "viewer")
    make_user("olga", "operator")
    workers = Workers(database_url(settings), own_redis.url)
    workers.start()
    panel = start_panel(database_url(settings), own_redis.url, tmp_path)
    try:
        started = manage(
            settings,
            own_redis.url,
            "launch",
            "--node",
            "spare",
            "--json",
            "--actor",
            "olga",
            "--",
            *CHATTY.split(),
        )
        assert started.returncode == 0, started.stderr
        launch = Launch.objects.get(pk=json.loads(started.stdout)["id"])
        received: list[tuple[int, str, int]] = []
        url = f"{panel.url}/launches/{launch.pk}/events/"
        reader = threading.Thread(
            target=lambda: received.extend(
                follow(url, panel.cookie_for(viewer), time.monotonic() + 120)
            )
        )
        reader.start()
        assert wait_until(
            lambda: (
                LaunchLogLine.objects.filter(launch=launch, text__contains="Decode batch,").count()
                > 300
            ),
            60,
        )
        own_redis.restart()  # mid-stream: the follower and the stream lose their Redis
        assert wait_until(
            lambda: LaunchLogLine.objects.filter(
                launch=launch, text__contains="batches done"
            ).exists(),
            60,
        )
        stopped = manage(
            settings, own_redis.url, "stop", str(launch.pk), "--json", "--actor", "olga"
        )
        assert stopped.returncode == 0, (stopped.stdout, stopped.stderr)
        assert json.loads(stopped.stdout)["status"] == "stopped"
        reader.join(90)
        assert not reader.is_alive(), "the live stream never said the log was complete"
    finally:
        panel.proc.kill()
        workers.stop()
    launch.refresh_from_db()
    seqs = [seq for seq, _, _ in received]
    assert seqs == list(range(1, launch.last_seq + 1)), "gaps or duplicates in the live stream"
    texts = [text for _, text, _ in received]
    done = next(t for t in texts if "batches done" in t)
    total = int(re.search(r"done: (\d+) lines", done).group(1))
    counts = [int(m.group(1)) for t in texts if (m := re.search(r"#token: (\d+),", t))]
    assert counts == list(range(1, total + 1))
    stored = list(LaunchLogLine.objects.filter(launch=launch).values_list("text", flat=True))
    assert stored == texts


def test_a_worker_holding_messages_survives_a_redis_restart(settings, own_redis, transactional_db):
    from celery import Celery

    workers = Workers(database_url(settings), own_redis.url)
    workers.start("default")
    try:
        before = Celery(broker=own_redis.url, set_as_current=False)
        before.send_task(
            "nodes.reconcile_launches", countdown=120, queue="default"
        )  # held by the worker (ETA)
        inspect = before.control.inspect(timeout=5, limit=1)
        assert wait_until(lambda: any((inspect.scheduled() or {}).values()), 60)
        connected = workers.log("default").count("] Connected to ")
        own_redis.restart()
        # The worker saw its connection break and made a new one (or died trying).
        assert wait_until(
            lambda: (
                workers.log("default").count("] Connected to ") > connected
                or workers.procs["default"].poll() is not None
            ),
            60,
        ), workers.log("default")[-3000:]
        assert workers.procs["default"].poll() is None, workers.log("default")[-3000:]
        after = Celery(
            broker=own_redis.url, backend=own_redis.url, set_as_current=False
        )  # a new CLI call, say
        assert after.send_task("nodes.reconcile_launches", queue="default").get(timeout=60) == 0
    finally:
        workers.stop()
