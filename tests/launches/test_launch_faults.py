"""Faults around running launches on the simulated fleet (real workers, Redis, sshd): a node
whose host key changed, a stop sent while the node's link is down, a stop whose worker died."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from nodes import ssh
from nodes.models import AuditEntry, Launch, Node, NodeEvent, Reservation
from nodes.models.choices import LaunchStatus, NodeStatus
from nodes.services import tokens
from nodes.workflows import discovery, ending, launching
from tests.factories import make_user
from tests.fleet import simfleet, wait_until
from tests.launching import SMALL, node_fixture, sglang_processes, status_of, wait_for
from tests.workers import FAST

pytestmark = pytest.mark.django_db(transaction=True)
spare = node_fixture("spare")


@pytest.fixture
def olga(db):
    return make_user("olga", "operator")


def reason_of(launch: Launch) -> str:
    launch.refresh_from_db()
    return launch.reason


def api_stop(launch: Launch, user) -> int:
    """What the launch page's and the API's stop do: queue the stop task."""
    response = Client().post(
        f"/api/launches/{launch.pk}/stop",
        HTTP_AUTHORIZATION=f"Bearer {tokens.create(user, 'stop')}",
    )
    return response.status_code


def ready_launch(node, olga) -> Launch:
    launch = launching.submit(node=node, command=SMALL, actor=olga)
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED) == LaunchStatus.READY, (
        launch.reason
    )
    return launch


def test_a_changed_host_key_stops_new_work_and_leaves_the_running_launch(
    spare, olga, launch_workers
):
    from nodes.services.hostkeys import offer_host_key, trust_host_key

    launch = ready_launch(spare, olga)
    sim = spare.sim
    sim.host_key_fingerprint = simfleet("rekey", sim.name, "--state", sim.state).stdout.strip()

    # One heartbeat notices it (a fresh handshake, not the pooled connection) and marks the node.
    discovery.heartbeat_sweep(timeout=4)
    node = Node.objects.get(pk=spare.pk)
    assert node.status == "host_key_changed", (node.status, node.status_reason)
    assert (
        "HOST KEY CHANGED" in node.status_reason and sim.host_key_fingerprint in node.status_reason
    )
    assert NodeEvent.objects.filter(node=node, kind="host_key").exists()
    entry = AuditEntry.objects.get(action="node.host_key_changed", object_id=str(node.pk))
    assert entry.after["presented"] == sim.host_key_fingerprint

    # Nothing new starts there: no launch, no discovery.
    with pytest.raises(launching.LaunchInputError, match="host key changed"):
        launching.submit(node=node, command=SMALL, actor=olga)
    with pytest.raises(ssh.RemoteError) as refused:
        discovery.discover(node.pk)
    assert refused.value.kind == "host_key_mismatch"

    # The running launch is left as it is, says why, and is not marked lost.
    assert wait_until(lambda: "cannot be reached safely" in reason_of(launch), 20), launch.reason
    wait_until(lambda: False, int(FAST["RANKWISE_LOST_AFTER_SECONDS"]) + 4)  # past "lost"
    assert status_of(launch) == LaunchStatus.READY, launch.reason
    assert len([p for p in sglang_processes(sim) if "scheduler" in p]) == 2

    # An admin trusts the new key: the node is contacted again and the launch followed.
    admin = make_user("ada", "admin")
    key = offer_host_key(node, actor=admin)
    node.refresh_from_db()
    trust_host_key(node, key.fingerprint, actor=admin)
    assert Node.objects.get(pk=node.pk).status == NodeStatus.UNKNOWN
    assert wait_until(lambda: "following resumed" in reason_of(launch), 30), launch.reason
    assert ending.stop(launch.pk, actor=olga).clean


def test_a_stop_while_the_link_is_down_is_retried_until_it_is_done(spare, olga, launch_workers):
    launch = ready_launch(spare, olga)
    simfleet("link", "spare", "down", "--state", spare.sim.state)
    try:
        assert api_stop(launch, olga) == 202
        assert wait_until(lambda: "stop pending" in reason_of(launch), 90), launch.reason
        assert launch.status == LaunchStatus.STOPPING
        assert "unreachable" in launch.reason and "retrying (attempt" in launch.reason
        shown = Client().get(
            f"/api/launches/{launch.pk}",
            HTTP_AUTHORIZATION=f"Bearer {tokens.create(olga, 'read')}",
        )
        assert shown.json()["reason"].startswith("stop pending")
    finally:
        simfleet("link", "spare", "up", "--state", spare.sim.state)
    assert wait_for(launch, LaunchStatus.STOPPED, timeout=120) == LaunchStatus.STOPPED, (
        launch.reason
    )
    assert launch.reason.startswith("stopped by olga")
    assert sglang_processes(spare.sim) == []
    assert not Reservation.objects.filter(launch=launch).exists()


def test_a_stop_whose_worker_died_is_finished_by_the_reconciler(spare, olga, launch_workers):
    launch = ready_launch(spare, olga)
    # A server slow to exit (stopped, so only the SIGKILL after the grace period ends it):
    # the stop is certainly still running when its worker is killed.
    spare.sim.ok(f"kill -STOP {launch.pid}")
    assert api_stop(launch, olga) == 202
    # The stop's SIGTERM reached the group (the ranks exit; the stopped server waits for the
    # SIGKILL after the grace period): the worker dies mid-stop, and the server exits.
    assert wait_until(lambda: not any("scheduler" in p for p in sglang_processes(spare.sim)), 30)
    assert status_of(launch) == LaunchStatus.STOPPING
    launch_workers.kill("default")
    spare.sim.run(f"kill -KILL -- -{launch.pgid}")
    assert wait_until(lambda: sglang_processes(spare.sim) == [], 20)
    assert status_of(launch) == LaunchStatus.STOPPING
    assert Reservation.objects.filter(launch=launch).exists()

    launch_workers.start("default")  # its reconciler pass finds the stuck stop
    assert wait_for(launch, LaunchStatus.STOPPED, timeout=60) == LaunchStatus.STOPPED, launch.reason
    assert launch.reason.startswith("stopped by olga")
    assert not Reservation.objects.filter(launch=launch).exists()


def test_a_stop_refused_for_a_changed_host_key_says_so_on_the_launch(spare, olga, launch_workers):
    from nodes.services.hostkeys import offer_host_key, trust_host_key

    launch = ready_launch(spare, olga)
    sim = spare.sim
    sim.host_key_fingerprint = simfleet("rekey", sim.name, "--state", sim.state).stdout.strip()
    discovery.heartbeat_sweep(timeout=4)
    assert wait_until(lambda: "cannot be reached safely" in reason_of(launch), 20), launch.reason

    assert api_stop(launch, olga) == 202
    assert wait_until(lambda: reason_of(launch).startswith("stop failed"), 30), launch.reason
    assert "HOST KEY CHANGED" in launch.reason and launch.status == LaunchStatus.READY
    # The follower, still noticing the changed key, leaves the stop's failure on the launch.
    wait_until(lambda: False, 8)
    assert reason_of(launch).startswith("stop failed"), launch.reason
    token: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(olga, 'validate')}"}
    shown = Client().get(f"/api/launches/{launch.pk}", **token).json()
    assert shown["reason"].startswith("stop failed")
    checked = (
        Client()
        .post(
            "/api/profiles/validate",
            {"node": "spare", "args": SMALL.split()[3:]},
            content_type="application/json",
            **token,
        )
        .json()
    )
    texts = [m["text"] for m in checked["messages"]]
    assert any("spare cannot be reached safely: HOST KEY CHANGED" in t for t in texts), texts

    admin = make_user("ada", "admin")
    node = Node.objects.get(pk=spare.pk)
    key = offer_host_key(node, actor=admin)
    node.refresh_from_db()
    trust_host_key(node, key.fingerprint, actor=admin)
    assert ending.stop(launch.pk, actor=olga).clean
