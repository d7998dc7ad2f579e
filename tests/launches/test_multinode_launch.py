"""One server over two simulated nodes (issue 22), as an operator runs it: the CLI through real
Celery workers, pre-flight on every node (each check named by its node), the nodes started
together, one log with both nodes' lines, stop on both, and the failures that name the node."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from nodes.models import Launch
from nodes.models.choices import LaunchStatus
from nodes.services import tokens
from nodes.workflows import discovery
from tests import launching as shared
from tests.conftest import TEST_REDIS_URL, manage_py, register_sim_node
from tests.factories import make_user
from tests.fleet import simfleet, wait_until
from tests.launching import sglang_processes, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
pair_fleet, pair = shared.pair_fleet, shared.pair  # two 8-GPU nodes, "pa" and "pb"
SERVER = ["python3", "-m", "sglang.launch_server"]
KIMI = ["--model-path", "/srv/models/kimi-k2", "--tp", "16", "--nnodes", "2"]
QWEN = ["--model-path", "/srv/models/qwen2.5-7b", "--tp", "4", "--nnodes", "2"]


@pytest.fixture
def cli(settings):
    def run(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
        return manage_py(settings, *args, env={"REDIS_URL": TEST_REDIS_URL}, timeout=timeout)

    return run


def _launch(cli, nodes: str, *flags: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    done = cli(
        "launch", "--node", nodes, "--actor", "olga", "--json", *extra, "--", *SERVER, *flags
    )
    assert done.stdout, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    doc["returncode"] = done.returncode
    return doc


def _failed(doc: dict) -> list[tuple[str, str]]:
    return [(c["name"], c.get("node", "")) for c in doc["checks"] if not c["passed"]]


def test_kimi_k2_over_two_nodes_reaches_ready_and_stop_leaves_nothing(cli, pair, launch_workers):
    a, b = pair
    doc = _launch(cli, "pa,pb", *KIMI, extra=("--wait", "ready"))
    assert doc["returncode"] == 0 and doc["status"] == "ready", (
        doc,
        list(Launch.objects.values("node__name", "status", "reason")),
    )
    assert [n["node"] for n in doc["nodes"]] == ["pa", "pb"]
    assert doc["dist_init_addr"] == f"{a.sim.fabric['address']}:5000"
    # Every check is named by its node, or is the group's own (versions, network, the store).
    assert {c.get("node") for c in doc["checks"]} >= {"pa", "pb"}
    assert {"network", "dist_init", "sglang"} <= {c["name"] for c in doc["checks"]}
    launch = Launch.objects.get(pk=doc["id"])
    part = launch.parts.get()
    assert (part.node.name, part.node_rank, part.status) == ("pb", 1, LaunchStatus.READY)
    assert len(part.gpus) == 8 and len(launch.gpus) == 8
    # Started together: node 1 first, node 0 right after it (its store waits for node 1).
    assert part.started <= launch.started
    assert (launch.started - part.started).total_seconds() < 10
    # One log: both nodes' lines, each tagged with its node, ranks by their global number.
    lines = launch.lines.order_by("seq")
    assert {line.node for line in lines} == {"pa", "pb"}
    assert lines.filter(node="pb", rank="TP15").exists()
    assert lines.filter(node="pa", rank="TP0").exists()
    assert not lines.filter(node="pa", rank="TP8").exists()

    printed = cli("launch-log", str(launch.pk))
    assert printed.returncode == 0 and "[pb] " in printed.stdout and "[pa] " in printed.stdout
    pointed = cli("launch-log", str(part.pk))
    assert pointed.returncode == 2 and f"launch-log {launch.pk}" in pointed.stderr

    stopped = cli("stop", str(launch.pk), "--actor", "olga", "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert wait_for(launch, LaunchStatus.STOPPED) == LaunchStatus.STOPPED
    assert wait_for(part, LaunchStatus.STOPPED) == LaunchStatus.STOPPED
    assert sglang_processes(a.sim) == [] and sglang_processes(b.sim) == []
    assert not launch.reservations.exists() and not part.reservations.exists()


def test_preflight_names_the_node_whose_gpus_are_busy(cli, pair, launch_workers):
    _, b = pair
    simfleet("hold", "pb", "--gpu", "1", "--memory", "10GiB", "--state", b.sim.state)
    try:
        doc = _launch(cli, "pa,pb", *QWEN)
    finally:
        simfleet("release", "pb", "--state", b.sim.state)
    assert doc["returncode"] == 2 and doc["status"] == "blocked", doc
    assert ("gpus_idle", "pb") in _failed(doc)
    assert "pb" in doc["reason"]
    part = Launch.objects.get(pk=doc["id"]).parts.get()
    assert part.status == LaunchStatus.BLOCKED and not part.reservations.exists()


def test_preflight_names_the_node_without_the_model(cli, pair, launch_workers):
    a, _ = pair
    # The model under a path only node 0 has (each node has its own /tmp).
    a.sim.ok("ln -sfn /srv/models/qwen2.5-7b /tmp/qwen")
    try:
        doc = _launch(cli, "pa,pb", "--model-path", "/tmp/qwen", *QWEN[2:])
    finally:
        a.sim.ok("rm -f /tmp/qwen")
    assert doc["returncode"] == 2 and doc["status"] == "blocked", doc
    assert ("model_path", "pb") in _failed(doc)
    assert ("model_path", "pa") not in _failed(doc)


def test_preflight_refuses_a_store_port_node_1_cannot_reach(cli, pair, launch_workers):
    _, b = pair
    simfleet("link", "pb", "down", "--fabric", "--state", b.sim.state)
    try:
        doc = _launch(cli, "pa,pb", *QWEN)
    finally:
        simfleet("link", "pb", "up", "--fabric", "--state", b.sim.state)
    assert doc["returncode"] == 2 and doc["status"] == "blocked", doc
    assert ("dist_init", "pb") in _failed(doc)
    reach = next(c for c in doc["checks"] if c["name"] == "dist_init")
    assert "pb cannot reach" in reach["detail"] and ":5000" in reach["detail"]


def test_forced_past_preflight_with_node_1_cut_off_it_fails_naming_node_1(
    cli, pair, launch_workers
):
    a, b = pair
    simfleet("link", "pb", "down", "--fabric", "--state", b.sim.state)
    try:
        doc = _launch(
            cli,
            "pa,pb",
            *QWEN,
            "--dist-timeout",
            "40",
            extra=("--override", "dist_init", "--reason", "testing", "--wait", "ready"),
        )
    finally:
        simfleet("link", "pb", "up", "--fabric", "--state", b.sim.state)
    assert doc["returncode"] == 1 and doc["status"] == "failed", doc
    launch = Launch.objects.get(pk=doc["id"])
    part = launch.parts.get()
    assert wait_for(part, LaunchStatus.FAILED) == LaunchStatus.FAILED
    assert wait_until(lambda: sglang_processes(a.sim) == [], 30), sglang_processes(a.sim)
    assert wait_until(lambda: sglang_processes(b.sim) == [], 30), sglang_processes(b.sim)
    launch.refresh_from_db()
    assert wait_until(lambda: Launch.objects.get(pk=launch.pk).diagnosis, 60)
    launch.refresh_from_db()
    words = json.dumps(launch.diagnosis)
    assert launch.diagnosis["category"] == "nccl-init-hang", launch.diagnosis
    assert "pb" in words and "TP2" in words, launch.diagnosis


def test_preflight_refuses_nodes_with_different_sglang(cli, sim_fleet, launch_workers):
    for name in ("incident", "modern"):
        sim = sim_fleet[name]
        sim.reboot()
        node = register_sim_node(sim)
        discovery.discover(node.pk)
    make_user("olga", "operator")
    doc = _launch(cli, "incident,modern", *QWEN)
    assert doc["returncode"] == 2 and doc["status"] == "blocked", doc
    assert ("sglang", "modern") in _failed(doc)
    version = next(c for c in doc["checks"] if c["name"] == "sglang" and not c["passed"])
    assert "0.5.23" in version["detail"] and "0.5.9" in version["detail"]


def test_a_multi_node_command_on_one_node_is_refused_with_what_to_do(cli, pair):
    doc = cli("launch", "--node", "pa", "--actor", "olga", "--json", "--", *SERVER, *QWEN)
    assert doc.returncode == 2
    assert "name its 2 nodes" in doc.stderr + doc.stdout
    assert not Launch.objects.exists()


def test_a_node_lost_mid_run_makes_the_launch_lost_and_stops_the_others(cli, pair, launch_workers):
    a, b = pair
    doc = _launch(cli, "pa,pb", *QWEN, extra=("--wait", "ready"))
    assert doc["status"] == "ready", doc
    launch = Launch.objects.get(pk=doc["id"])
    part = launch.parts.get()
    simfleet("link", "pb", "down", "--state", b.sim.state)  # the panel loses pb; pa is fine
    try:
        assert wait_for(launch, LaunchStatus.LOST, timeout=120) == LaunchStatus.LOST
        assert "pb (node rank 1) lost" in launch.reason, launch.reason
        # Node 0's ranks would wait on pb's for ever: they are stopped, its GPUs released.
        assert wait_until(lambda: sglang_processes(a.sim) == [], 60), sglang_processes(a.sim)
        assert wait_until(lambda: not launch.reservations.exists(), 30)
    finally:
        simfleet("link", "pb", "up", "--state", b.sim.state)
    # pb answers again: its ranks are stopped too and the launch ends failed, diagnosed.
    assert wait_for(part, LaunchStatus.FAILED, timeout=120) == LaunchStatus.FAILED
    assert wait_for(launch, LaunchStatus.FAILED, timeout=30) == LaunchStatus.FAILED
    assert wait_until(lambda: sglang_processes(b.sim) == [], 60), sglang_processes(b.sim)


def test_the_api_launches_over_two_nodes_and_names_the_node_of_each_check(
    client, pair, launch_workers
):
    a, b = pair
    user = make_user("api-olga", "operator")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(user, 'test')}"}
    command = " ".join([*SERVER, *QWEN])

    def post(body: dict) -> Any:
        return client.post(
            "/api/launches", data=json.dumps(body), content_type="application/json", **headers
        )

    assert post({"node": "pa", "command": command}).status_code == 400  # --nnodes 2, one node
    assert post({"node": "pa,,pb", "command": command}).status_code == 400
    assert post({"node": "pa,nowhere", "command": command}).status_code == 404
    assert not Launch.objects.exists()
    made = post({"node": "pa,pb", "command": command})
    assert made.status_code == 202, made.content
    assert [n["node"] for n in made.json()["nodes"]] == ["pa", "pb"]
    launch = Launch.objects.get(pk=made.json()["id"])
    assert wait_for(launch, LaunchStatus.READY, timeout=120) == LaunchStatus.READY, launch.reason
    got = client.get(f"/api/launches/{launch.pk}", **headers).json()
    assert got["dist_init_addr"] == f"{a.sim.fabric['address']}:5000"
    assert {c.get("node") for c in got["checks"]} >= {"pa", "pb"}
    assert client.post(f"/api/launches/{launch.pk}/stop", **headers).status_code == 202
    assert wait_for(launch, LaunchStatus.STOPPED, timeout=120) == LaunchStatus.STOPPED
    assert sglang_processes(a.sim) == [] and sglang_processes(b.sim) == []


def test_a_stop_waits_on_a_node_that_does_not_answer_naming_it_and_audits_the_launch(
    cli, pair, launch_workers
):
    """Found by an adversarial pass: the launch read ``stopped`` while pb's stop was still being
    retried with its ranks running, and the asker's audit entry named pb's part."""
    from django.contrib.auth.models import User
    from django.test import Client

    from nodes.models import AuditEntry

    a, b = pair
    doc = _launch(cli, "pa,pb", *QWEN, extra=("--wait", "ready"))
    assert doc["status"] == "ready", doc
    launch = Launch.objects.get(pk=doc["id"])
    part = launch.parts.get()
    simfleet("link", "pb", "down", "--state", b.sim.state)
    try:
        # Stop from the part's page, as an operator would (the task is queued, the page returns).
        page = Client()
        page.force_login(User.objects.get(username="olga"))
        assert page.post(f"/launches/{part.pk}/stop/").status_code == 302
        assert wait_for(launch, LaunchStatus.STOPPING, timeout=30) == LaunchStatus.STOPPING

        def waiting() -> bool:
            launch.refresh_from_db()
            return "waiting on pb" in launch.reason

        assert wait_until(waiting, 180), (launch.status, launch.reason)
        assert launch.status == LaunchStatus.STOPPING
        assert wait_until(lambda: sglang_processes(a.sim) == [], 30), sglang_processes(a.sim)
    finally:
        simfleet("link", "pb", "up", "--state", b.sim.state)
    assert wait_for(part, LaunchStatus.STOPPED, timeout=120) == LaunchStatus.STOPPED, part.reason
    assert wait_for(launch, LaunchStatus.STOPPED, timeout=60) == LaunchStatus.STOPPED
    assert sglang_processes(b.sim) == []
    asked = AuditEntry.objects.filter(action="launch.stop")
    assert [(e.object_id, e.actor_name) for e in asked] == [(str(launch.pk), "olga")]
