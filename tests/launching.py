"""Helpers for tests that launch on the simulated fleet: nodes registered and discovered from
the fleet, waiting for a launch's status, SGLang's processes on a node."""

from __future__ import annotations

import pytest

from nodes.models import Launch
from nodes.workflows import discovery
from tests.conftest import register_sim_node
from tests.factories import make_user
from tests.fleet import bring_up, simfleet, wait_until

SMALL = "python3 -m sglang.launch_server --model-path /srv/models/qwen2.5-7b --tp-size 2"


def status_of(launch: Launch) -> str:
    launch.refresh_from_db()
    return launch.status


def wait_for(launch: Launch, *statuses: str, timeout: float = 90) -> str:
    wait_until(lambda: status_of(launch) in statuses, timeout, 0.3)
    return launch.status


def sglang_processes(sim) -> list[str]:
    """SGLang's own processes on the node: ranks by their title, servers by their command
    (not the panel's launch control, whose source mentions SGLang while it runs)."""
    found = []
    for line in sim.ok("ps -eo pid,stat,args").splitlines()[1:]:
        args = line.split(None, 2)[2] if len(line.split(None, 2)) == 3 else ""
        words = args.split()
        if words and (
            words[0].startswith("sglang::") or words[1:3] == ["-m", "sglang.launch_server"]
        ):
            found.append(line)
    return found


def node_fixture(name: str):
    @pytest.fixture
    def fixture(sim_fleet):
        sim = sim_fleet[name]
        sim.make_clean()
        node = register_sim_node(sim)
        discovery.discover(node.pk)
        node.refresh_from_db()
        node.sim = sim
        return node

    return fixture


@pytest.fixture(scope="module")
def pair_fleet(tmp_path_factory):
    """Two 8-GPU nodes like the incident's, on one fabric."""
    state = str(tmp_path_factory.mktemp("pair-fleet"))
    node = {"gpus": 8, "gpu_memory": "141GiB", "host_ram": "449GB", "speed": 8}
    try:
        yield bring_up(state, {"nodes": [{"name": n, **node} for n in ("pa", "pb")]})
    finally:
        simfleet("down", "--state", state, check=False)


@pytest.fixture
def pair(pair_fleet):
    nodes = []
    for name in ("pa", "pb"):
        sim = pair_fleet[name]
        sim.make_clean()
        node = register_sim_node(sim)
        discovery.discover(node.pk)
        node.refresh_from_db()
        node.sim = sim
        nodes.append(node)
    make_user("olga", "operator")
    return nodes
