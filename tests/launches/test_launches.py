"""Launches end to end on the simulated fleet: real Celery workers in their own processes, the
real Redis, real sshd on each node and the SGLang stand-in, through the product's services."""

from __future__ import annotations

import json
import threading

import pytest

from nodes.models import AuditEntry, Launch, LaunchLogLine, Reservation
from nodes.models.choices import LaunchStatus
from nodes.services import bundles
from nodes.workflows import ending, launching
from tests.conftest import manage_py
from tests.factories import make_user
from tests.fleet import simfleet, wait_until
from tests.launching import SMALL, node_fixture, sglang_processes, status_of, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
KIMI = "--model-path /srv/models/kimi-k2 --tp-size 8 --trust-remote-code"
CORRECTED = (
    f"python3 -m sglang.launch_server {KIMI} --mem-fraction-static 0.85 "
    "--enable-hierarchical-cache --hicache-size 37"
)
INCIDENT = (
    f"python3 -m sglang.launch_server {KIMI} --mem-fraction-static 0.85 "
    "--enable-hierarchical-cache --hicache-size 300"
)


def gpu_used(sim, index: int) -> int:
    out = sim.ok(f"nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i {index}")
    return int(out.strip())


def stored_lines(launch: Launch) -> list[tuple[int, str]]:
    return list(LaunchLogLine.objects.filter(launch=launch).values_list("seq", "text"))


def assert_whole_log(launch: Launch, sim) -> None:
    """Every line the server wrote is stored once, in order, numbered 1..N."""
    launch.refresh_from_db()
    rows = stored_lines(launch)
    assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1))
    written = sim.ok(f"cat {launch.remote_dir}/server.log").count("\n")
    assert len(rows) == written == launch.last_seq


incident = node_fixture("incident")
spare = node_fixture("spare")


@pytest.fixture
def olga(db):
    return make_user("olga", "operator")


def test_corrected_incident_reaches_ready_with_phases_then_stop_frees_everything(
    incident, olga, launch_workers
):
    idle = [gpu_used(incident.sim, g) for g in range(8)]
    launch = launching.submit(node=incident, command=CORRECTED, actor=olga)
    assert launch.adhoc and launch.gpus == list(range(8))
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED, LaunchStatus.BLOCKED) == (
        LaunchStatus.READY
    ), launch.reason
    assert all(c["passed"] for c in launch.checks), launch.checks
    numbers = launch.progress["numbers"]
    assert launch.progress["phase"] == "ready"
    assert numbers["host_pool_gb"] == 37 and numbers["host_pool_lines"] == 8
    assert numbers["shards_done"] == numbers["shards_total"] > 0
    assert numbers["kv_tokens"] > 0 and numbers["weights_gib"] > 0
    assert launch.server_info["hicache_size"] == 37
    assert launch.server_info["tp_size"] == 8
    assert launch.server_info["max_total_num_tokens"] == numbers["max_total_num_tokens"]
    ready_line = LaunchLogLine.objects.get(
        launch=launch, text__contains="The server is fired up and ready to roll!"
    )
    assert ready_line.seq <= launch.last_seq
    assert gpu_used(incident.sim, 0) > idle[0]

    outcome = ending.stop(launch.pk, actor=olga)
    assert outcome.clean, (outcome.remaining, outcome.held_gpus, outcome.error)
    assert status_of(launch) == LaunchStatus.STOPPED
    assert not Reservation.objects.filter(launch=launch).exists()
    assert sglang_processes(incident.sim) == []
    assert [gpu_used(incident.sim, g) for g in range(8)] == idle
    wait_until(lambda: Launch.objects.get(pk=launch.pk).log_complete, 15)
    assert_whole_log(launch, incident.sim)


def test_gpus_held_by_a_foreign_process_are_refused_with_its_pid(incident, olga, launch_workers):
    simfleet("hold", "incident", "--gpu", "3", "--memory", "20GiB", "--state", incident.sim.state)
    try:
        holder = [
            line.split()[0]
            for line in incident.sim.ok("ps -eo pid,args").splitlines()
            if "simnode.hold" in line
        ]
        launch = launching.submit(node=incident, command=SMALL, actor=olga, gpus=[3, 4])
        assert wait_for(
            launch, LaunchStatus.BLOCKED, LaunchStatus.STARTING, LaunchStatus.READY
        ) == (LaunchStatus.BLOCKED)
        idle = next(c for c in launch.checks if c["name"] == "gpus_idle")
        assert not idle["passed"] and "GPU 3" in idle["detail"]
        assert any(f"PID {pid}" in idle["detail"] for pid in holder), idle["detail"]
        assert "gpus_idle" in launch.reason
        assert not Reservation.objects.filter(launch=launch).exists()
        assert sglang_processes(incident.sim) == []
    finally:
        simfleet("release", "incident", "--state", incident.sim.state)


def test_two_simultaneous_launches_onto_the_same_gpus_run_exactly_one(spare, olga, launch_workers):
    results: list[Launch | Exception] = []
    barrier = threading.Barrier(2)

    def launch_one() -> None:
        from django.db import connection

        try:
            barrier.wait()
            results.append(launching.submit(node=spare, command=SMALL, actor=olga, gpus=[0, 1]))
        except Exception as exc:  # noqa: BLE001 — the test reports it
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=launch_one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    made = [r for r in results if isinstance(r, Launch)]
    assert len(made) == 2, results
    first, second = sorted(made, key=lambda r: r.status == LaunchStatus.BLOCKED)
    assert second.status == LaunchStatus.BLOCKED
    assert "already held" in second.reason and f"launch #{first.pk}" in second.reason
    assert wait_for(first, LaunchStatus.READY, LaunchStatus.FAILED) == LaunchStatus.READY
    scheduler_ranks = [p for p in sglang_processes(spare.sim) if "scheduler" in p]
    assert len(scheduler_ranks) == 2  # one server of two ranks, not two servers
    assert ending.stop(first.pk, actor=olga).clean


def test_the_incident_forced_past_preflight_fails_with_a_snapshot_and_its_diagnosis(
    incident, olga, launch_workers, settings, tmp_path
):
    launch = launching.submit(
        node=incident,
        command=INCIDENT,
        actor=olga,
        overrides={"budget": "reproducing the incident on purpose"},
    )
    assert wait_for(launch, LaunchStatus.FAILED, LaunchStatus.READY, timeout=60) == (
        LaunchStatus.FAILED
    )
    # 0.5.9 would wait for the OOM-killed rank until NCCL's timeout; the panel does not.
    assert "died during start-up" in launch.reason, launch.reason
    budget = next(c for c in launch.checks if c["name"] == "budget")
    assert not budget["passed"] and budget["override"] == "reproducing the incident on purpose"
    assert "2400" in budget["detail"] or "per rank" in budget["detail"], budget["detail"]
    override = AuditEntry.objects.get(action="launch.override", object_id=str(launch.pk))
    assert override.actor_name == "olga" and override.after["check"] == "budget"
    wait_until(lambda: Launch.objects.get(pk=launch.pk).snapshot, 30)
    launch.refresh_from_db()
    snap = launch.snapshot
    assert snap["meminfo"]["MemTotal"] > 0 and "MemAvailable" in snap["meminfo"]
    assert len(snap["gpus"]) == 8 and "processes" in snap["gpus"][0]
    assert "members" in snap["launch"] and "listening_ports" in snap
    assert any(
        "oom" in line.lower() or "killed process" in line.lower() for line in snap["oom_lines"]
    )
    assert launch.progress["numbers"]["host_pool_lines"] >= 1
    wait_until(lambda: Launch.objects.get(pk=launch.pk).log_complete, 30)
    assert sglang_processes(incident.sim) == []
    assert_whole_log(launch, incident.sim)

    # The diagnosis: 0.5.9 checks each rank alone, so 8 × 300 GB went past the node's RAM. It
    # is a task of its own, queued when the launch failed.
    wait_until(lambda: Launch.objects.get(pk=launch.pk).diagnosis, 60)
    launch.refresh_from_db()
    ram_gb = round(incident.host_ram_bytes / 1e9)
    diagnosis = launch.diagnosis
    assert launch.diagnosis_category == diagnosis["category"] == "host-oom-hicache"
    assert "8 ranks x 300 GB = 2400 GB" in diagnosis["summary"], diagnosis["summary"]
    assert f"{ram_gb} GB host RAM" in diagnosis["summary"], diagnosis["summary"]
    assert diagnosis["numbers"]["aggregate_gb"] == 2400
    fix = diagnosis["changes"]["--hicache-size"]
    assert 8 * fix < ram_gb, diagnosis["changes"]
    # Sampled during start-up: host RAM climbed as the ranks pinned their pools.
    samples = launch.memory_timeline
    assert len(samples) >= 2 and samples[0]["t"] == 0
    used = [s["host_total_bytes"] - s["host_available_bytes"] for s in samples]
    assert max(used) > used[0] and set(samples[0]["gpus"]) == {str(g) for g in range(8)}

    # Its downloaded bundle says the same through the CLI.
    archive = tmp_path / f"launch-{launch.pk}.tar.gz"
    archive.write_bytes(bundles.launch_bundle(launch))
    cli = manage_py(settings, "diagnose", str(archive), "--json")
    assert cli.returncode == 0, cli.stderr
    doc = json.loads(cli.stdout)
    assert doc["category"] == "host-oom-hicache" and doc["summary"] == diagnosis["summary"]


def test_a_worker_killed_mid_start_loses_no_launch_and_no_line(incident, olga, launch_workers):
    launch = launching.submit(node=incident, command=CORRECTED, actor=olga)
    assert wait_for(launch, LaunchStatus.LOADING, LaunchStatus.READY, LaunchStatus.FAILED) == (
        LaunchStatus.LOADING
    ), launch.reason
    launch_workers.kill("streams")
    assert status_of(launch) == LaunchStatus.LOADING  # only a follower can make it ready
    launch_workers.start("streams")
    # Ready is set by the restarted follower alone; the node may have printed every line before
    # the kill on a loaded machine, so whether new lines came after it is not the test: the
    # whole log below is.
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED, timeout=120) == (
        LaunchStatus.READY
    ), launch.reason
    assert ending.stop(launch.pk, actor=olga).clean
    wait_until(lambda: Launch.objects.get(pk=launch.pk).log_complete, 20)
    assert_whole_log(launch, incident.sim)


def test_a_node_cut_off_for_a_minute_is_lost_then_recovered(incident, olga, launch_workers):
    launch = launching.submit(node=incident, command=SMALL, actor=olga)
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED) == LaunchStatus.READY
    simfleet("link", "incident", "down", "--state", incident.sim.state)
    try:
        assert wait_for(launch, LaunchStatus.LOST, timeout=40) == LaunchStatus.LOST
        assert "has not answered" in launch.reason
        wait_until(lambda: False, 45)  # the rest of the minute
        assert status_of(launch) == LaunchStatus.LOST
    finally:
        simfleet("link", "incident", "up", "--state", incident.sim.state)
    assert wait_for(launch, LaunchStatus.READY, timeout=60) == LaunchStatus.READY
    assert "answers again" in launch.reason
    assert ending.stop(launch.pk, actor=olga).clean
    wait_until(lambda: Launch.objects.get(pk=launch.pk).log_complete, 20)
    assert_whole_log(launch, incident.sim)


def test_secrets_are_masked_in_the_stored_command_environment_and_log(spare, olga, launch_workers):
    command = (
        "HF_TOKEN=hf_secret_value MY_PASSWD=pw_secret_value AWS_SECRET_ACCESS_KEY=aws_secret_value "
        "PGPASSWORD=pg_secret_value GH_TOKENS=gh_secret_value "
        f"{SMALL} --api-key sk-very-secret --tool-server http://u:pw-tool-secret9@tools:9"
    )
    launch = launching.submit(node=spare, command=command, actor=olga)
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED) == LaunchStatus.READY
    assert ending.stop(launch.pk, actor=olga).clean
    wait_until(lambda: Launch.objects.get(pk=launch.pk).log_complete, 20)
    stored = "\n".join(text for _, text in stored_lines(launch))
    assert "sk-very-secret" not in stored and "****" in stored  # server_args echoes the key
    node_files = spare.sim.ok(f"cat {launch.remote_dir}/command {launch.remote_dir}/env")
    assert "sk-very-secret" not in node_files and "_secret_value" not in node_files
    audit = json.dumps(list(AuditEntry.objects.values("after")), default=str)
    assert "sk-very-secret" not in audit and "_secret_value" not in audit
    # A password inside a flag's value: masked in the log, the node's files and the audit.
    assert not [t for t in (stored, node_files, audit) if "pw-tool-secret9" in t]
    assert "http://u:****@tools:9" in node_files
    assert "--api-key '****'" in launch.revision.command_line()


def test_a_rank_killed_after_ready_makes_the_launch_failed_not_running(spare, olga, launch_workers):
    launch = launching.submit(node=spare, command=SMALL, actor=olga)
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED) == LaunchStatus.READY
    spare.sim.ok("pkill -9 -f '^sglang::scheduler_TP1'")
    # SGLang 0.5.9 has no liveness watchdog: the server keeps answering, /health says 503.
    assert wait_for(launch, LaunchStatus.FAILED, timeout=60) == LaunchStatus.FAILED
    assert "health check failed" in launch.reason or "exited" in launch.reason, launch.reason
    wait_until(lambda: Launch.objects.get(pk=launch.pk).snapshot, 30)
    wait_until(lambda: Launch.objects.get(pk=launch.pk).log_complete, 30)
    assert sglang_processes(spare.sim) == []
    assert not Reservation.objects.filter(launch=launch).exists()
    # The same engine reads the runtime failure: ready first, then the rank or /health.
    # The diagnosis is a task of its own, queued when the launch failed.
    wait_until(lambda: Launch.objects.get(pk=launch.pk).diagnosis, 60)
    launch.refresh_from_db()
    diagnosis = launch.diagnosis
    assert diagnosis["category"] == "health-check-failure", diagnosis
    assert "the server was ready (line" in diagnosis["summary"]
    assert "scheduler_TP1" in diagnosis["summary"] or "/health failed" in diagnosis["summary"]


def test_the_whole_log_is_archived_masked_as_it_streams_from_the_node(spare, olga):
    # Past RANKWISE_LOG_LINES_MAX the follower archives the node's server.log, which holds the
    # secrets in clear (ServerArgs, the echoed command); the archive must not.
    import gzip
    import shlex

    from nodes.models import LaunchProfile, ProfileRevision
    from nodes.workflows.following import Follower

    profile = LaunchProfile.objects.create(name="archive", created_by="olga")
    revision = ProfileRevision.objects.create(
        profile=profile,
        number=1,
        args=["--model-path", "/m", "--api-key", "sk-archive-77", "--max-total-tokens", "100000"],
        env={"MY_PASSWD": "pw-archive-88"},
        author="olga",
        node=spare,
        verdict="ok",
        report={},
    )
    folder = "/tmp/rankwise-archive-test"
    launch = Launch.objects.create(
        revision=revision,
        node=spare,
        gpus=[0],
        port=30000,
        created_by="olga",
        startup_timeout_s=60,
        status=LaunchStatus.STOPPED,
        remote_dir=folder,
    )
    lines = [
        "server_args=ServerArgs(api_key='sk-archive-77', max_total_tokens=100000)",
        "MY_PASSWD=pw-archive-88 python3 -m sglang.launch_server --api-key sk-archive-77",
        "max_total_num_tokens=100000, chunked_prefill_size=8192",
    ]
    spare.sim.ok(
        f"mkdir -p {folder} && for i in $(seq 2000); do printf '%s\\n' {shlex.join(lines)}; "
        f"done > {folder}/server.log"
    )
    follower = Follower(launch.pk)
    follower.secrets = ["sk-archive-77", "pw-archive-88", "100000"]
    follower._archive(launch)
    launch.refresh_from_db()
    archived = gzip.decompress(bytes(launch.log_archive or b"")).decode()
    assert "sk-archive-77" not in archived and "pw-archive-88" not in archived
    assert archived.count("max_total_num_tokens=100000") == 2000
    assert archived.count("api_key='****'") == 2000 and len(archived.splitlines()) == 6000
