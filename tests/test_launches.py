"""Launches end to end on the simulated fleet: real workers, Redis, sshd and SGLang stand-in."""

from __future__ import annotations

import pytest

from nodes.choices import LaunchStatus
from nodes.models import Launch, Reservation
from nodes.services import discovery, launches
from tests.conftest import register_sim_node
from tests.factories import make_user
from tests.fleet import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
CORRECTED = (
    "python3 -m sglang.launch_server --model-path /srv/models/kimi-k2 --tp-size 8 "
    "--mem-fraction-static 0.85 --enable-hierarchical-cache --hicache-size 37 "
    "--trust-remote-code --port 30000"
)


def status_of(launch: Launch) -> str:
    launch.refresh_from_db()
    return launch.status


def wait_for(launch: Launch, *statuses: str, timeout: float = 90) -> str:
    wait_until(lambda: status_of(launch) in statuses, timeout, 0.3)
    return launch.status


@pytest.fixture
def incident(sim_fleet):
    sim = sim_fleet["incident"]
    sim.reboot()
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    node.refresh_from_db()
    return node


@pytest.fixture
def operator_user(db):
    return make_user("olga", "operator")


def test_corrected_incident_reaches_ready_then_stops_clean(
    incident, operator_user, launch_workers, sim_fleet
):
    revision = launches.adhoc_revision(CORRECTED, incident, operator_user)
    launch = launches.create(node=incident, revision=revision, actor=operator_user)
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED, LaunchStatus.BLOCKED) == (
        LaunchStatus.READY
    ), (launch.reason, launch.checks, launch_workers.log("default")[-3000:])
    assert launch.progress["phase"] == "ready"
    assert launch.server_info["hicache_size"] == 37
    print(launch.progress, launch.server_info)
    outcome = launches.stop(launch.pk, actor=operator_user)
    assert outcome.clean, outcome
    assert not Reservation.objects.filter(launch=launch).exists()
    out = sim_fleet["incident"].ok("ps -eo pid,args | grep -c [s]glang || true")
    assert out.strip() == "0"
