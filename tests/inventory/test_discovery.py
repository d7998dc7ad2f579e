"""Discovery and heartbeat on the simulated fleet: real sshd, Celery worker and Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodes import ssh
from nodes.models import Node, NodeEvent
from nodes.workflows import discovery
from tests.conftest import TEST_REDIS_URL, manage_py, register_sim_node
from tests.fleet import simfleet

pytestmark = pytest.mark.django_db(transaction=True)
GiB = 2**30
ROOT = Path(__file__).resolve().parents[2]


def test_discovery_through_the_worker_fills_the_inventory(sim_fleet, celery_worker):
    from nodes.tasks import discover_node

    node = register_sim_node(sim_fleet["incident"])
    result = discover_node.delay(node.pk).get(timeout=60)
    assert result["gpu_source"] == "nvml" and result["problems"] == []
    node.refresh_from_db()
    assert node.status == "ready" and node.last_seen is not None
    assert node.gpu_summary() == "8 × NVIDIA H200 · 96 GiB"
    assert [g.index for g in node.gpus.all()] == list(range(8))
    assert all(g.uuid.startswith("GPU-") for g in node.gpus.all())
    assert node.host_ram_bytes == 449 * 10**9 // 1024 * 1024  # MemTotal is in kB
    assert node.mem_available_bytes < node.host_ram_bytes
    assert node.sglang_version == "0.5.9"
    assert node.facts["cpu_count"] >= 1 and node.facts["shm_bytes"] == 64 * GiB
    # Its addresses, for a multi-node launch: its own network's (eth1) among them.
    fabric = sim_fleet["incident"].fabric
    assert [fabric["interface"], f"{fabric['address']}/24"] in node.facts["interfaces"]


def test_nvml_missing_falls_back_to_nvidia_smi_and_says_so(sim_fleet):
    node = register_sim_node(sim_fleet["no-nvml"])
    facts = discovery.discover(node.pk)
    node.refresh_from_db()
    assert facts.gpu_source == "nvidia-smi" and len(facts.gpus) == 2
    assert "NVML Shared Library Not Found" in facts.notes[0]
    assert node.status == "ready"
    assert node.facts["cgroup_limit_bytes"] == 100 * 10**9


def test_a_node_without_pynvml_gets_the_panels_nvidia_ml_py_with_the_agent(sim_fleet, settings):
    """The node's Python has no pynvml: the agent imports the panel's nvidia-ml-py (this very
    distribution, by version and by the digest of the file that ran). A simulated node has no
    NVML library, so nvidia-ml-py's own loader fails and nvidia-smi answers, saying why."""
    import hashlib
    import importlib.metadata

    from nodes.remote import client, shipped

    sim = sim_fleet["bare"]
    status, _, _ = sim.run("python3 -c 'import pynvml'")
    assert status != 0  # the node really has none
    node = register_sim_node(sim)
    facts = discovery.discover(node.pk)
    version = importlib.metadata.version("nvidia-ml-py")
    assert facts.pynvml_from == "panel" and facts.pynvml_version == version
    assert facts.gpu_source == "nvidia-smi" and len(facts.gpus) == 2
    assert facts.nvml_error == "NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    assert facts.gpu_reading == (
        "nvidia-smi: NVML did not answer (NVMLError_LibraryNotFound: NVML Shared Library Not "
        f"Found; through nvidia-ml-py {version} sent by the panel (the node's Python has no "
        "pynvml))"
    )
    node.refresh_from_db()
    assert node.status == "ready" and node.facts["gpu_reading"] == facts.gpu_reading

    # The module that ran is the panel's file, byte for byte.
    from nodes.services.credentials import target_for

    source = Path(str(importlib.metadata.distribution("nvidia-ml-py").locate_file("pynvml.py")))
    with ssh.pool.session(target_for(node)) as conn:
        argv, stdin = client._agent(conn, "probe", "--live", "python3", pynvml=True)
        answer = json.loads(ssh.run(conn, argv, stdin=stdin, check=False).stdout)
    assert answer["pynvml"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert answer["pynvml"]["sha256"] == getattr(shipped.pynvml(), "sha256", None)

    # The operator's reading says the same (CLI, as the API's).
    done = manage_py(settings, "gpus", node.name, "--json", timeout=120)
    doc = json.loads(done.stdout)
    assert doc["source"] == "nvidia-smi" and doc["reading"] == facts.gpu_reading


def test_a_node_with_its_own_pynvml_answers_by_nvml_and_says_whose(sim_fleet):
    node = register_sim_node(sim_fleet["incident"])
    facts = discovery.discover(node.pk)
    assert facts.gpu_source == "nvml" and facts.pynvml_from == "node"
    assert facts.gpu_reading.startswith("NVML, through the node's pynvml")
    # Its users, for the user servers run as (checked when an admin names one).
    assert facts.accounts is not None and "root" in facts.accounts
    node.refresh_from_db()
    assert "root" in node.facts["accounts"]


def test_driver_missing_is_gpus_not_detected_with_the_reason_never_zero_gpus(sim_fleet, client):
    node = register_sim_node(sim_fleet["no-driver"])
    facts = discovery.discover(node.pk)
    node.refresh_from_db()
    assert facts.gpus == () and facts.gpu_source is None
    assert node.status == "degraded"
    assert node.status_reason.startswith("GPUs not detected: NVML: Driver Not Loaded")
    assert "nvidia-smi is not installed" in node.status_reason
    from tests.factories import make_user

    client.force_login(make_user("vera", "viewer"))
    page = client.get(f"/nodes/{node.pk}/").content.decode()
    assert "GPUs not detected" in page and "no GPUs recorded" not in page
    listing = client.get("/").content.decode()
    assert "GPUs not detected" in listing


def test_a_changed_host_key_is_refused_and_nothing_runs(sim_fleet):
    sim = sim_fleet["spare"]
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    ssh.pool.close()
    log = Path(sim.state, "nodes", sim.name, "sshd.log")
    accepted = log.read_text().count("Accepted publickey")
    sim.host_key_fingerprint = simfleet("rekey", sim.name, "--state", sim.state).stdout.strip()
    with pytest.raises(ssh.RemoteError) as err:
        discovery.discover(node.pk)
    assert err.value.kind == "host_key_mismatch"
    assert "HOST KEY CHANGED" in err.value.message and "Nothing was run" in err.value.message
    assert log.read_text().count("Accepted publickey") == accepted
    node.refresh_from_db()
    assert node.status == "host_key_changed" and "HOST KEY CHANGED" in node.status_reason
    assert node.gpus.count() == 2  # the inventory kept what was known


def test_an_untrusted_host_key_is_refused(sim_fleet):
    node = register_sim_node(sim_fleet["modern"], trust=False)
    with pytest.raises(ssh.RemoteError) as err:
        discovery.discover(node.pk)
    assert err.value.kind == "host_key_unknown" and "nothing was run" in err.value.message


def test_link_cut_mid_heartbeat_makes_only_that_node_unreachable(sim_fleet):
    nodes = [register_sim_node(sim_fleet[n]) for n in ("incident", "spare", "leaky")]
    discovery.heartbeat_sweep(timeout=4)
    seen = {n.name: Node.objects.get(pk=n.pk).last_seen for n in nodes}
    spare = sim_fleet["spare"]
    simfleet("link", "spare", "down", "--state", spare.state)
    try:
        started = time.monotonic()
        discovery.heartbeat_sweep(timeout=4)
        elapsed = time.monotonic() - started
    finally:
        simfleet("link", "spare", "up", "--state", spare.state)
    assert elapsed < 10  # well inside one 30 s interval, dead node included
    after = {n.name: Node.objects.get(pk=n.pk) for n in nodes}
    assert after["spare"].status == "unreachable"
    assert after["spare"].last_seen == seen["spare"]
    for name in ("incident", "leaky"):
        assert after[name].status == "ready" and after[name].last_seen > seen[name]
    assert NodeEvent.objects.filter(node__name="spare", message__contains="→ unreachable").exists()
    discovery.heartbeat_sweep(timeout=4)
    assert Node.objects.get(name="spare").status == "ready"


def test_heartbeat_sees_gpu_memory_change(sim_fleet):
    sim = sim_fleet["leaky"]
    sim.make_clean()
    ssh.pool.close()
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    simfleet("hold", "leaky", "--gpu", "1", "--memory", "10GiB", "--state", sim.state)
    try:
        discovery.heartbeat_sweep(timeout=5)
        gpu = node.gpus.get(index=1)
        assert gpu.memory_used_bytes >= 10 * GiB
        assert [p["name"] for p in gpu.processes] == ["/usr/bin/python3"]
    finally:
        simfleet("release", "leaky", "--state", sim.state)


@pytest.mark.parametrize(
    "hostile",
    [
        "; touch /tmp/pwned",
        "$(touch /tmp/pwned)",
        "`touch /tmp/pwned`",
        "python3\ntouch /tmp/pwned",
        "'; touch /tmp/pwned; '",
        '"; touch /tmp/pwned; "',
        "python3 && touch /tmp/pwned",
    ],
)
def test_hostile_values_reach_the_node_as_plain_arguments(sim_fleet, hostile):
    sim = sim_fleet["spare"]
    node = register_sim_node(sim)
    Node.objects.filter(pk=node.pk).update(sglang_python=hostile)
    facts = discovery.discover(node.pk)
    assert any(p.startswith("SGLang not found") for p in facts.problems)
    status, _, _ = sim.run("test -e /tmp/pwned")
    assert status == 1, f"{hostile!r} was interpreted by a shell"


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    from django.conf import settings

    db = settings.DATABASES["default"]
    url = (
        f"sqlite:///{db['NAME']}"
        if db["ENGINE"].endswith("sqlite3")
        else f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    )
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url, "REDIS_URL": TEST_REDIS_URL, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_add_trusts_the_host_key_and_discover_prints_json(sim_fleet, celery_worker):
    sim = sim_fleet["modern"]
    added = _cli(
        "node", "add", "modern", "--host", sim.host, "--key-file", sim.key_path, "--trust-host-key"
    )
    assert added.returncode == 0, added.stderr
    assert f"Trusted host key {sim.host_key_fingerprint}" in added.stderr
    inline = _cli("node", "discover", "modern", "--inline", "--json")
    assert inline.returncode == 0, inline.stderr
    doc = json.loads(inline.stdout)
    assert {
        "gpus",
        "host_ram_bytes",
        "mem_available_bytes",
        "gpu_source",
        "sglang_version",
        "problems",
    } <= set(doc)
    assert doc["sglang_version"] == "0.5.23" and len(doc["gpus"]) == 8
    assert {"index", "name", "memory_total_bytes", "memory_used_bytes"} <= set(doc["gpus"][0])
    assert "Discovering modern" in inline.stderr
    through_worker = _cli("node", "discover", "modern", "--json")
    assert through_worker.returncode == 0, through_worker.stderr
    assert json.loads(through_worker.stdout)["gpus"] == doc["gpus"]


def test_cli_discover_of_an_unreachable_node_exits_1_with_json(sim_fleet):
    sim = sim_fleet["spare"]
    node = register_sim_node(sim)
    simfleet("link", "spare", "down", "--state", sim.state)
    try:
        result = _cli("node", "discover", node.name, "--inline", "--json")
    finally:
        simfleet("link", "spare", "up", "--state", sim.state)
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["kind"] in ("timeout", "unreachable") and doc["name"] == "spare"


def test_untrusted_nodes_are_unknown_not_unreachable_and_heartbeat_leaves_them(sim_fleet):
    node = register_sim_node(sim_fleet["no-nvml"], trust=False)
    with pytest.raises(ssh.RemoteError):
        discovery.discover(node.pk)
    node.refresh_from_db()
    assert node.status == "unknown" and "no admin has trusted yet" in node.status_reason
    assert discovery.heartbeat_sweep(timeout=3) == []


def test_cli_trust_host_key_needs_the_checked_fingerprint(sim_fleet):
    sim = sim_fleet["leaky"]
    node = register_sim_node(sim, trust=False)
    shown = _cli("node", "trust-host-key", node.name)
    assert shown.returncode == 0 and shown.stdout.strip() == sim.host_key_fingerprint
    assert "run this again with --fingerprint" in shown.stderr
    wrong = _cli("node", "trust-host-key", node.name, "--fingerprint", "SHA256:nope")
    assert wrong.returncode == 1 and "nothing was trusted" in wrong.stderr
    node.refresh_from_db()
    assert node.host_key == ""
    right = _cli("node", "trust-host-key", node.name, "--fingerprint", sim.host_key_fingerprint)
    assert right.returncode == 0, right.stderr
    node.refresh_from_db()
    assert node.host_key_fingerprint == sim.host_key_fingerprint
    # On the node, the fingerprint an operator checks is the one it presents.
    on_node = sim.ok("ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub").split()[1]
    assert on_node == sim.host_key_fingerprint


def test_profile_geometry_is_read_from_the_node(sim_fleet):
    from nodes.services.model_facts import model_facts
    from nodes.services.profiles import evaluate

    sim = sim_fleet["incident"]
    # Its GPUs must be empty for the device pool's arithmetic: another test may have left a
    # server or held memory on this node (seen in a full run: the pool was not estimated).
    sim.make_clean()
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    node.refresh_from_db()
    model = model_facts(node, sim.models["kimi-k2"])
    # Kimi-K2.5 INT4: about 595 GB of shards (their headers included).
    assert 595 * 10**9 < model.weights_bytes < 596 * 10**9 and model.geometry.is_mla
    assert model.geometry.tensors  # the safetensors headers were read
    assert model.source == f"read from incident:{sim.models['kimi-k2']}"
    args = [
        "--model-path",
        sim.models["kimi-k2"],
        "--tp-size",
        "8",
        "--mem-fraction-static",
        "0.93",
        "--enable-hierarchical-cache",
        "--hicache-size",
        "300",
    ]
    report = evaluate(args, node, model)
    assert report.verdict == "block" and report.device_kv_tokens_per_rank > 0
    missing = model_facts(node, "/srv/models/nope")
    assert missing.geometry is None
    assert missing.source == "no model folder at /srv/models/nope on incident"
