"""Shared world: one user per role, logged-in clients, and a real Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.test import Client

from tests.factories import make_user
from tests.fleet import bring_up, simfleet
from tests.panel import start_panel

# The fleet the simulated-node tests share. Each node has a job; tests that leave a node dirty
# reboot it first (see ``fresh``). Sizes follow the incident: 8 × 96 GiB GPUs, 449 GB of RAM.
FLEET_SPEC = {
    "nodes": [
        {
            "name": "incident",
            "gpus": 8,
            "gpu_memory": "96GiB",
            "host_ram": "449GB",
            "sglang_version": "0.5.9",
            "speed": 8,
        },
        {
            "name": "modern",
            "gpus": 8,
            "gpu_memory": "96GiB",
            "host_ram": "449GB",
            "sglang_version": "0.5.23",
            "speed": 8,
        },
        {
            "name": "leaky",
            "gpus": 2,
            "gpu_memory": "80GiB",
            "host_ram": "200GB",
            "faults": ["leak-on-crash"],
            "speed": 8,
        },
        {"name": "no-nvml", "gpus": 2, "faults": ["no-nvml"], "cgroup_limit": "100GB", "speed": 8},
        {"name": "no-driver", "gpus": 2, "faults": ["no-driver"], "speed": 8},
        {
            "name": "stuck",
            "gpus": 2,
            "gpu_memory": "80GiB",
            "host_ram": "200GB",
            "faults": ["stuck-on-kill"],
            "speed": 8,
        },
        {"name": "spare", "gpus": 2, "gpu_memory": "80GiB", "host_ram": "200GB", "speed": 8},
    ]
}


TEST_REDIS_URL = os.environ.get("RANKWISE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture(scope="session", autouse=True)
def celery_app_for_tests():
    """The product's Celery app on a Redis database of the tests' own, for every test (a
    running panel's worker on the usual database must not take the tests' tasks, nor the tests
    queue work for it)."""
    from controlpanel.celery import app

    redis.Redis.from_url(TEST_REDIS_URL).flushdb()
    app.conf.update(broker_url=TEST_REDIS_URL, result_backend=TEST_REDIS_URL)
    return app


@pytest.fixture
def celery_worker(celery_app_for_tests, transactional_db):
    """A real Celery worker (in this process, solo pool) consuming from the real Redis."""
    from celery.contrib.testing.worker import start_worker

    with start_worker(
        celery_app_for_tests,
        pool="solo",
        queues=["default", "streams"],
        perform_ping_check=False,
        shutdown_timeout=30,
    ) as worker:
        yield worker


def register_sim_node(node, *, name: str | None = None, trust: bool = True):
    """Put a simulated node in the inventory the way an admin would: key stored, host key
    fetched and trusted (through the product's own services)."""
    from nodes.models import Node, SshCredential
    from nodes.services.credentials import create_credential
    from nodes.services.hostkeys import offer_host_key, trust_host_key
    from tests.factories import make_user

    admin = make_user(f"admin-{node.name}", "admin")
    key_text = Path(node.key_path).read_text()
    credential = SshCredential.objects.filter(name="fleet-key").first() or create_credential(
        "fleet-key", key_text, None, actor=admin
    )
    record = Node.objects.create(
        name=name or node.name,
        host=node.host,
        port=node.port,
        ssh_user=node.user,
        credential=credential,
    )
    if trust:
        key = offer_host_key(record, actor=admin)
        record.refresh_from_db()
        trust_host_key(record, key.fingerprint, actor=admin)
        record.refresh_from_db()
    return record


@pytest.fixture(scope="session")
def sim_fleet(tmp_path_factory):
    """A simulated fleet for the whole session, always torn down at the end."""
    state = str(tmp_path_factory.mktemp("fleet"))
    try:
        yield bring_up(state, FLEET_SPEC)
    finally:
        simfleet("down", "--state", state, check=False)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(tmp_path_factory):
    """Give an SQLite test database a file, so subprocesses (the CLI, the panel) can see it."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        db.setdefault("TEST", {})["NAME"] = str(tmp_path_factory.mktemp("db") / "test.sqlite3")


@pytest.fixture
def viewer(db):
    return make_user("vera", "viewer")


@pytest.fixture
def operator(db):
    return make_user("otto", "operator")


@pytest.fixture
def admin_user(db):
    return make_user("ada", "admin")


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer_client(viewer) -> Client:
    return _client_for(viewer)


@pytest.fixture
def operator_client(operator) -> Client:
    return _client_for(operator)


@pytest.fixture
def admin_client_(admin_user) -> Client:
    return _client_for(admin_user)


def database_url(settings) -> str:
    """The test database as a DATABASE_URL, for subprocesses (CLI, workers, the panel)."""
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"


def manage_py(
    settings, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` in a subprocess on the test database, as an operator runs it; acts as
    the built-in ``cli`` account unless ``RANKWISE_ACTOR`` is in ``env``."""
    # The tests' broker too: what the command queues (a diagnosis after a cleanup) reaches
    # the tests' workers, as the panel's CLI reaches the panel's.
    environ = {
        **os.environ,
        "DATABASE_URL": database_url(settings),
        "REDIS_URL": TEST_REDIS_URL,
        **(env or {}),
    }
    if "RANKWISE_ACTOR" not in (env or {}):
        environ.pop("RANKWISE_ACTOR", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=Path(__file__).resolve().parent.parent,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def launch_workers(settings, transactional_db, celery_app_for_tests):
    """Real Celery workers in their own processes, as `./run` starts them (a `default` queue
    worker and a thread-pool `streams` worker), on the test database and broker; they can be
    killed and restarted."""
    from tests.workers import Workers

    workers = Workers(database_url(settings), TEST_REDIS_URL)
    workers.start()
    try:
        yield workers
    finally:
        workers.stop()


@pytest.fixture
def panel(settings, transactional_db, tmp_path):
    """The real ASGI panel in its own process (live logs stream over Server-Sent Events)."""
    server = start_panel(database_url(settings), TEST_REDIS_URL, tmp_path)
    try:
        yield server
    finally:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture
def olga(db):
    """Olga, an operator: who launches in the fleet tests."""
    from tests.factories import make_user

    return make_user("olga", "operator")
