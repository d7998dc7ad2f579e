"""Shared world: one user per role, logged-in clients, and a real Redis."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.factories import make_user
from tests.fleet import bring_up, simfleet

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
