"""Shared world: one user per role, logged-in clients, and a real Redis."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import redis
from django.test import Client

from tests.factories import make_user
from tests.fleet import bring_up, simfleet, wait_until
from tests.panel import Panel, start_panel
from tests.redis_server import OwnRedis
from tests.workers import Workers

# The fleet the simulated-node tests share (one per pytest process). Each node has a job; a test
# starts from a node as booted (``SimNode.make_clean``: rebooted only if an earlier test left it
# otherwise). Sizes follow the incident: 8 × 96 GiB GPUs, 449 GB of RAM.
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
            # The incident's node with the incident's aftermath: OOM-killed ranks leave their
            # GPU memory held with no process.
            "name": "leaky",
            "gpus": 8,
            "gpu_memory": "96GiB",
            "host_ram": "449GB",
            "sglang_version": "0.5.9",
            "faults": ["leak-on-crash"],
            "speed": 8,
        },
        {"name": "no-nvml", "gpus": 2, "faults": ["no-nvml"], "cgroup_limit": "100GB", "speed": 8},
        {"name": "no-driver", "gpus": 2, "faults": ["no-driver"], "speed": 8},
        # A driver but no nvidia-ml-py in the node's Python: the panel sends its own pynvml.
        {"name": "bare", "gpus": 2, "faults": ["no-pynvml"], "speed": 8},
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


#: The Redis the tests' processes share: each pytest process starts a redis-server of its own
#: (``pytest_configure``), so that two processes of one run, or two runs at once, never share a
#: queue, a lock or a pub/sub channel. ``RANKWISE_TEST_REDIS_URL`` names one to use instead.
TEST_REDIS_URL = os.environ.get("RANKWISE_TEST_REDIS_URL", "")
_own_redis: OwnRedis | None = None


def _is_xdist_controller(config: pytest.Config) -> bool:
    """True in the process that only hands tests to xdist's workers (it runs none itself)."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    global TEST_REDIS_URL, _own_redis
    if _is_xdist_controller(config) or TEST_REDIS_URL:
        return
    logs = Path(tempfile.mkdtemp(prefix="rankwise-redis-"))
    _own_redis = OwnRedis(logs)
    _own_redis.start()
    TEST_REDIS_URL = _own_redis.url
    # Every process the tests start (workers, the panel, the CLI) and the product's own code in
    # this process (the live channel, the Celery app) use it.
    os.environ["REDIS_URL"] = TEST_REDIS_URL
    from django.conf import settings

    settings.REDIS_URL = settings.CELERY_BROKER_URL = TEST_REDIS_URL
    settings.CELERY_RESULT_BACKEND = TEST_REDIS_URL


def pytest_unconfigure(config: pytest.Config) -> None:
    if _own_redis is not None:
        _own_redis.kill()


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
    """A test database of this process's own: an SQLite file (so subprocesses, the CLI and the
    panel, can see it) in this process's temporary folder, or a PostgreSQL database named after
    this process, so that xdist's processes and two runs at once never share one."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        db.setdefault("TEST", {})["NAME"] = str(tmp_path_factory.mktemp("db") / "test.sqlite3")
    else:
        db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_p{os.getpid()}"


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


def manage_in_process(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` through Django's own entry point (``execute_from_command_line``:
    the same parsing, one-line errors and exit status) but in this process, on the test's own
    database connection; for refusals and argument errors, where a process costs seconds and
    shows nothing more. ``manage_py`` keeps one real subprocess per command."""
    from django.core.management import execute_from_command_line
    from django.db import connections

    environ = dict(env or {})
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, environ))
        if "RANKWISE_ACTOR" not in environ:
            os.environ.pop("RANKWISE_ACTOR", None)
        # The command's end closes every connection, which would end the test's transaction.
        stack.enter_context(mock.patch.object(connections, "close_all"))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            execute_from_command_line(["manage.py", *args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(["manage.py", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def _shared_workers(django_db_setup, django_db_blocker) -> Iterator[Workers]:
    """One pair of worker processes for this pytest process, started when a test first needs
    them and stopped before the test database goes."""
    from django.conf import settings as django_settings

    workers = Workers(database_url(django_settings), TEST_REDIS_URL)
    workers.start()
    try:
        yield workers
    finally:
        workers.stop()


@pytest.fixture
def launch_workers(_shared_workers, transactional_db, celery_app_for_tests) -> Iterator[Workers]:
    """Real Celery workers in their own processes, as `./run` starts them (a `default` queue
    worker and a thread-pool `streams` worker), on the test database and broker; they can be
    killed and restarted. One pair serves every test of the process: a test gets them idle with
    empty queues, and one that leaves them busy (a server still followed, a retry waiting) or
    killed gets them restarted afresh before the tables are emptied."""
    _shared_workers.start_missing()
    yield _shared_workers
    _shared_workers.settle()


@pytest.fixture(scope="session")
def _shared_panel(django_db_setup, tmp_path_factory) -> Iterator[Panel]:
    from django.conf import settings as django_settings

    server = start_panel(
        database_url(django_settings), TEST_REDIS_URL, tmp_path_factory.mktemp("panel")
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker) -> Iterator[None]:
    """pytest-django's test database, which it drops at the end of the run; before that, every
    other session on it is ended. The processes this run started are gone by then (their
    fixtures end first), but a session of a killed process ends a moment after it, and a thread
    of this process that opened a connection (a follower run in-process) never closes it:
    either would make the drop fail and leave the database behind on the server."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    others = "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_terminate_backend(pid) {others}")  # noqa: S608 - no input

        def none_left() -> bool:
            cursor.execute(f"SELECT count(*) {others}")  # noqa: S608
            return bool(cursor.fetchone()[0] == 0)

        # A terminated session ends a moment later: the drop must not come before.
        wait_until(none_left, 10, interval=0.02)


@pytest.fixture
def panel(_shared_panel: Panel, transactional_db) -> Panel:
    """The real ASGI panel in its own process (live logs stream over Server-Sent Events); one
    serves every test of the process (it keeps no state of its own between requests)."""
    _shared_panel.ensure_running()
    return _shared_panel


@pytest.fixture
def olga(db):
    """Olga, an operator: who launches in the fleet tests."""
    from tests.factories import make_user

    return make_user("olga", "operator")


#: Markers given by fixture: a test is slow in the way its heaviest fixture is. ``--quick``
#: (``./run test --quick``) leaves out every test so marked.
_MARKS_BY_FIXTURE = {
    "fleet": ("sim_fleet", "pair_fleet"),
    "browser": ("browser", "page"),
    "workers": ("launch_workers", "celery_worker", "panel", "_shared_workers"),
}
_MARKS_BY_FOLDER = {"browser": "browser", "simfleet": "fleet"}


#: Names whose use means a test starts a program of the panel's own (the CLI, ./run, simfleet,
#: workers) in a subprocess: the ``process`` marker, found in the test's code or in the code of
#: the module's helpers it calls.
_PROCESS_NAMES = frozenset({"manage_py", "subprocess", "start_panel", "Workers", "simfleet"})


def _starts_processes(code: types.CodeType, module: dict, depth: int = 3) -> bool:
    names = set(code.co_names)
    if names & _PROCESS_NAMES:
        return True
    if depth == 0:
        return False
    nested = [c for c in code.co_consts if isinstance(c, types.CodeType)]
    helpers = [
        module[n].__code__
        for n in names
        if isinstance(module.get(n), types.FunctionType)
        and module[n].__module__ == module.get("__name__")
    ]
    return any(_starts_processes(c, module, depth - 1) for c in nested + helpers)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).resolve().parent
    for item in items:
        function = getattr(item, "function", None)
        if function is not None and _starts_processes(function.__code__, function.__globals__):
            item.add_marker("process")
        names = set(getattr(item, "fixturenames", ()))
        for mark, fixtures in _MARKS_BY_FIXTURE.items():
            if names.intersection(fixtures):
                item.add_marker(mark)
        folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
        if folder in _MARKS_BY_FOLDER:
            item.add_marker(_MARKS_BY_FOLDER[folder])
    # The longest tests first (as long as they took last time, tests/durations.json; a test not
    # timed yet by its markers): xdist hands them out in turn, so the long ones run side by side
    # and the many short ones fill the gaps at the end, instead of one long test starting last.
    # The order decides only when a test runs, never whether or how.
    known = _recorded_durations()
    items.sort(key=lambda item: -known.get(item.nodeid, _guess(item)))


DURATIONS = Path(__file__).resolve().parent / "durations.json"
_SLOW_MARKS = frozenset({"fleet", "browser", "workers", "process"})


def _recorded_durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _guess(item: pytest.Item) -> float:
    return 10.0 if _SLOW_MARKS.intersection(m.name for m in item.iter_markers()) else 0.1


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        action="store_true",
        help=f"write each test's time (set-up, call and teardown) to {DURATIONS.name}",
    )


_timings: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # In xdist's controller too: every worker's reports pass through it.
    _timings[report.nodeid] = _timings.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if config.getoption("--record-durations") and not hasattr(config, "workerinput"):
        rounded = {k: round(v, 2) for k, v in sorted(_timings.items())}
        DURATIONS.write_text(json.dumps(rounded, indent=0) + "\n")
