"""Stuck GPUs on the simulated fleet: inspect, clean up in escalating steps, quarantine what a
reset cannot free, refuse launches onto quarantined GPUs, free them after a reboot; foreign
holders survive unless named; defunct processes reaped; D state reported within bounded time.
The CLI runs as an operator does (its own process)."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from typing import Any, cast

import pytest
from django.utils import timezone

from nodes import ssh
from nodes.models import AuditEntry, Cleanup, GpuQuarantine, Launch, Reservation
from nodes.models.choices import LaunchStatus
from nodes.services import holders
from nodes.workflows import cleanup, discovery, ending, launching
from tests.conftest import manage_py
from tests.fleet import simfleet, wait_until
from tests.htmx import follow
from tests.launching import node_fixture, sglang_processes, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
QWEN = "python3 -m sglang.launch_server --model-path /srv/models/qwen2.5-7b --tp-size 2"
# The incident itself, forced past pre-flight: each rank's 300 GB passes 0.5.9's per-rank check
# on the 449 GB node; eight of them do not.
INCIDENT = (
    "python3 -m sglang.launch_server --model-path /srv/models/kimi-k2 --tp-size 8 "
    "--mem-fraction-static 0.93 --enable-hierarchical-cache --hicache-size 300 --trust-remote-code"
)

leaky = node_fixture("leaky")
spare = node_fixture("spare")
stuck = node_fixture("stuck")


@pytest.fixture
def olga(db):
    from tests.factories import make_user

    return make_user("olga", "operator")


def cli(settings, *args: str) -> tuple[int, dict]:
    done = manage_py(settings, *args, "--json", timeout=300)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_leaked_memory_is_reset_then_quarantined_refused_and_freed_by_a_reboot(
    leaky, olga, launch_workers, settings
):
    launch = launching.submit(
        node=leaky, command=INCIDENT, actor=olga, overrides={"budget": "the incident, on purpose"}
    )
    assert wait_for(launch, LaunchStatus.FAILED, LaunchStatus.READY, timeout=90) == "failed"
    wait_until(lambda: Launch.objects.get(pk=launch.pk).log_complete, 30)

    code, doc = cli(settings, "cleanup", "leaky", "--launch", str(launch.pk), "--yes")
    assert code == 1, doc
    steps = {s["key"]: s for s in doc["steps"]}
    assert list(steps) == list("abcdefgh")
    assert sglang_processes(leaky.sim) == []
    # f: memory still held, no process; g: the reset answered as nvidia-smi does; h: quarantine.
    # As on the incident's node: the ranks the OOM killer took left their GPU memory behind (the
    # kernel took their host pages back); TP0, hung in a collective with its dead peers, died by
    # SIGKILL with its GPU memory and its 300 GB of pinned host pool still held.
    assert "with no process" in steps["f"]["output"]
    assert "nvidia-smi --gpu-reset -i 0" in steps["g"]["command"]
    assert "not supported" in steps["g"]["output"] and steps["g"]["outcome"] == "failed"
    assert [g["state"] for g in doc["gpus"]] == ["quarantined"] * 8
    assert all(gpu["orphaned_bytes"] > 80 * 2**30 for gpu in steps["h"]["before"]["gpus"].values())
    assert "300 GB less than before the launch" in steps["f"]["output"]
    assert "reboot" in doc["message"]
    # The cleanup's reading is the bundle's latest snapshot: the question is now the leak (a
    # worker diagnoses the launch again, queued by the cleanup).
    wait_until(
        lambda: Launch.objects.get(pk=launch.pk).diagnosis_category != "host-oom-hicache", 30
    )
    diagnosis = Launch.objects.get(pk=launch.pk).diagnosis
    assert diagnosis["category"] == "leaked-gpu-memory", diagnosis
    assert "host-oom-hicache" in diagnosis["secondary_categories"]
    entry = AuditEntry.objects.get(action="node.cleanup")
    assert entry.actor_name == "cli" and entry.after["launch"] == launch.pk
    assert not Reservation.objects.filter(launch=launch).exists()

    code, state = cli(settings, "gpus", "leaky")
    assert code == 0
    gpu0 = state["gpus"][0]
    assert set(gpu0) == {
        "index",
        "state",
        "memory_used_bytes",
        "orphaned_bytes",
        "holders",
        "quarantine_reason",
    }
    assert gpu0["state"] == "quarantined" and gpu0["holders"] == []
    assert gpu0["orphaned_bytes"] == gpu0["memory_used_bytes"] > 10 * 2**30
    assert "driver reload or a reboot" in gpu0["quarantine_reason"]
    assert state["host"]["mem_total_bytes"] > 0

    refused = launching.submit(node=leaky, command=QWEN, actor=olga)
    assert wait_for(refused, LaunchStatus.BLOCKED, LaunchStatus.FAILED) == "blocked"
    check = next(c for c in refused.checks if c["name"] == "quarantine")
    assert not check["passed"] and "GPU 0 is quarantined" in check["detail"]
    assert "reboot" in check["detail"]

    leaky.sim.reboot()
    discovery.discover(leaky.pk)
    assert not GpuQuarantine.objects.filter(node=leaky, lifted_at__isnull=True).exists()
    code, state = cli(settings, "gpus", "leaky")
    assert [g["state"] for g in state["gpus"]] == ["free"] * 8
    assert AuditEntry.objects.filter(action="gpu.quarantine_lifted").count() == 8  # one a GPU


def test_a_foreign_holder_survives_a_cleanup_that_did_not_name_it(spare, settings):
    simfleet("hold", "spare", "--gpu", "1", "--memory", "20GiB", "--state", spare.sim.state)
    try:
        _, state = cli(settings, "gpus", "spare")
        holders = state["gpus"][1]["holders"]
        assert len(holders) == 1 and holders[0]["launch_id"] is None
        pid = holders[0]["pid"]

        code, doc = cli(settings, "cleanup", "spare", "--gpus", "0,1", "--yes")
        assert code == 1 and [g["state"] for g in doc["gpus"]] == ["free", "held"]
        assert (
            f"PID {pid} " in doc["steps"][4]["output"] and "left alone" in doc["steps"][4]["output"]
        )
        assert str(pid) in spare.sim.ok("ps -eo pid=").split()

        code, doc = cli(
            settings, "cleanup", "spare", "--gpus", "1", "--include-foreign", str(pid), "--yes"
        )
        assert code == 0 and doc["gpus"][0]["state"] == "free", doc
        # It left on SIGTERM: no SIGKILL goes to a PID that may be someone else's by now.
        assert doc["steps"][4]["command"] == f"kill -TERM {pid}"
        assert str(pid) not in spare.sim.ok("ps -eo pid=").split()
    finally:
        simfleet("release", "spare", "--state", spare.sim.state)


def test_the_cli_refuses_without_confirmation_and_bad_input_changes_nothing(spare, settings):
    done = manage_py(settings, "cleanup", "spare")
    assert done.returncode == 2 and "--yes" in done.stderr
    done = manage_py(settings, "cleanup", "spare", "--gpus", "7", "--yes")
    assert done.returncode == 2 and "spare has no GPU 7" in done.stderr
    done = manage_py(settings, "cleanup", "spare", "--include-foreign", "1", "--yes")
    assert done.returncode == 2 and "not a process id" in done.stderr
    done = manage_py(settings, "gpus", "nowhere")
    assert done.returncode == 2 and "no node named 'nowhere'" in done.stderr
    done = manage_py(settings, "cleanup", "spare", "--gpus", "", "--yes")
    assert done.returncode == 2 and "--gpus is empty" in done.stderr
    done = manage_py(settings, "cleanup", "spare", "--include-foreign", "٣", "--yes")
    assert done.returncode == 2 and "not a process id" in done.stderr
    done = manage_py(settings, "cleanup", "spare", "--yes", "--actor", "nobody")
    assert done.returncode == 2 and "no user named 'nobody'" in done.stderr
    assert not Cleanup.objects.exists()


def test_a_defunct_rank_is_reaped_when_its_parent_ignores_sigterm(spare, olga, settings):
    """A rank's parent that ignores SIGTERM and never collects its dead child: SIGTERM leaves
    both, SIGKILL of the group ends the parent, and the defunct child is collected."""
    launch = Launch.objects.create(
        revision=_revision(spare),
        node=spare,
        gpus=[0],
        port=30000,
        created_by="olga",
        startup_timeout_s=60,
        status=LaunchStatus.FAILED,
    )
    folder = f"/root/.rankwise/launches/{launch.pk}-test"
    script = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "if os.fork() == 0:\n    os._exit(0)\n"
        "time.sleep(600)\n"
    )
    spare.sim.ok(
        f"mkdir -p {folder} && echo {launch.pk} > {folder}/launch_id && "
        f"(RANKWISE_LAUNCH_ID={launch.pk} setsid python3 -c '{script}' {folder} "
        f"> /dev/null 2>&1 & echo $! > {folder}/pgid)"
    )
    pgid = int(spare.sim.ok(f"cat {folder}/pgid").strip())
    Launch.objects.filter(pk=launch.pk).update(pgid=pgid, remote_dir=folder)
    assert wait_until(lambda: "Z" in spare.sim.ok(f"ps -o stat= --ppid {pgid}; true"), 10)
    found = holders.inspect(spare)
    assert {h.state for h in found.holders if h.launch_id == launch.pk} == {"S", "Z"}

    job = cleanup.request(spare, actor=olga, launch=Launch.objects.get(pk=launch.pk))
    done = cleanup.run(job.pk)
    steps = {s.key: s for s in done.steps.all()}
    assert steps["a"].outcome == "some remain" and "still there" in steps["a"].output
    assert steps["b"].outcome == "done"
    assert spare.sim.ok(f"ps -o pid= --ppid {pgid}; ps -o pid= -p {pgid}; true").strip() == ""
    assert "Z" not in spare.sim.ok("ps -eo stat=").split()


def test_a_process_in_d_state_is_reported_not_waited_on(stuck, olga, launch_workers):
    launch = launching.submit(
        node=stuck,
        command=f"{QWEN} --mem-fraction-static 0.5 --enable-hierarchical-cache --hicache-size 40",
        actor=olga,
    )
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED, timeout=90) == "ready"
    stuck.sim.ok("pkill -KILL -f '^sglang::http_server'")
    assert wait_for(launch, LaunchStatus.FAILED, timeout=90) == "failed"
    wait_until(lambda: "D" in stuck.sim.ok("ps -eo stat=; true"), 30)
    try:
        job = cleanup.request(stuck, actor=olga, launch=Launch.objects.get(pk=launch.pk))
        begun = time.monotonic()
        done = cleanup.run(job.pk)
        assert time.monotonic() - begun < 120
        steps = {s.key: s for s in done.steps.all()}
        reported = steps["b"].output + steps["c"].output
        assert "state D" in reported, reported
        assert [g["state"] for g in done.result["gpus"]] == ["held", "held"]
        assert "uninterruptible" in done.message
    finally:
        stuck.sim.reboot()


def _revision(node: Any) -> Any:
    from nodes.models import LaunchProfile, ProfileRevision

    profile = LaunchProfile.objects.create(name="fake", created_by="olga")
    return ProfileRevision.objects.create(
        profile=profile, number=1, args=["--model-path", "/m"], env={}, author="olga", node=node,
        verdict="ok", report={},
    )  # fmt: skip


def test_a_launch_group_id_reused_by_another_process_is_left_alone(spare, olga):
    """The launch ended long ago; its process group id now leads someone else's group."""
    launch = Launch.objects.create(
        revision=_revision(spare),
        node=spare,
        gpus=[0],
        port=30000,
        created_by="olga",
        startup_timeout_s=60,
        status=LaunchStatus.STOPPED,
        ended=timezone.now() - timedelta(hours=1),
    )
    folder = f"/root/.rankwise/launches/{launch.pk}-old"
    spare.sim.ok(
        f"mkdir -p {folder} && echo {launch.pk} > {folder}/launch_id && "
        f"(setsid sleep 600 > /dev/null 2>&1 & echo $! > {folder}/pgid)"
    )
    other = int(spare.sim.ok(f"cat {folder}/pgid").strip())
    Launch.objects.filter(pk=launch.pk).update(pgid=other, remote_dir=folder)
    try:
        job = cleanup.request(spare, actor=olga, launch=Launch.objects.get(pk=launch.pk))
        steps = {s.key: s for s in cleanup.run(job.pk).steps.all()}
        assert steps["a"].outcome == steps["b"].outcome == "nothing to do"
        assert str(other) in spare.sim.ok("ps -eo pid=").split()
    finally:
        spare.sim.ok(f"kill {other}; rm -rf {folder}")


def test_a_node_lost_mid_cleanup_ends_it_in_error_without_acting_on_old_readings(
    spare, olga, monkeypatch
):
    real, calls = holders.inspect, []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            raise ssh.RemoteError("unreachable", "no route to host")
        return real(*args, **kwargs)

    monkeypatch.setattr(cleanup, "inspect", flaky)
    job = cleanup.request(spare, actor=olga, gpus=[0, 1])
    done = cleanup.run(job.pk)
    assert done.status == "error" and "stopped answering after step f" in done.message
    assert [s.key for s in done.steps.all()] == list("abcdef")
    assert done.steps.get(key="f").outcome == "failed" and done.result is None
    assert not GpuQuarantine.objects.exists()


def test_an_outsider_cannot_end_a_team_only_launch_through_a_cleanup(
    spare, launch_workers, settings
):
    """The adversarial sequence: op1's team-only launch is ready on GPU 0; op2 (another team)
    reads the holders, names the launch's PID in a cleanup (API, CLI) and is refused; a cleanup
    recorded anyway (or of the GPU without PIDs) signals none of its processes."""
    from django.test import Client
    from django.urls import reverse

    from nodes.models import LaunchProfile, Team
    from nodes.services import tokens
    from tests.factories import make_user

    alpha, beta = Team.objects.create(name="alpha"), Team.objects.create(name="beta")
    op1, op2 = make_user("op1", "operator"), make_user("op2", "operator")
    alpha.members.add(op1.pk)
    beta.members.add(op2.pk)
    launch = launching.submit(node=spare, command=QWEN, actor=op1)
    LaunchProfile.objects.filter(pk=launch.revision.profile_id).update(
        team=alpha, visibility=LaunchProfile.Visibility.TEAM
    )
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED, timeout=90) == "ready"
    api = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.create(op2, 'test')}")
    holders = api.get("/api/nodes/spare/gpus").json()["gpus"][0]["holders"]
    assert holders and all(h["team_only"] and h["launch_id"] is None for h in holders)
    pid = holders[0]["pid"]
    # The CLI acting as op2 masks them as the API does; acting as op1 it names the launch.
    for actor, hidden in (("op2", True), ("op1", False)):
        done = manage_py(settings, "gpus", "spare", "--json", "--actor", actor)
        seen = json.loads(done.stdout)["gpus"][0]["holders"]
        assert {h["team_only"] for h in seen} == {hidden}, seen
        assert {h["launch_id"] for h in seen} == ({None} if hidden else {launch.pk})
        assert ("sglang" in json.dumps(seen)) is not hidden

    answer = api.post(
        "/api/nodes/spare/cleanup",
        {"gpus": [0], "include_foreign": [pid]},
        content_type="application/json",
    )
    assert answer.status_code == 400, answer.content
    assert "team-only launch" in answer.json()["detail"]
    assert f"#{launch.pk}" not in answer.json()["detail"]
    done = manage_py(
        settings, "cleanup", "spare", "--gpus", "0", "--include-foreign", str(pid), "--yes",
        env={"RANKWISE_ACTOR": "op2"},
    )  # fmt: skip
    assert done.returncode == 2 and "team-only launch" in done.stderr, done.stderr
    # The cleanup form does not offer it, and a forged tick is refused.
    page = Client()
    page.force_login(cast(Any, op2))
    url = reverse("nodes:node-cleanup", args=[spare.pk])
    # No launch named: the page does not speak of one, nor offer itself again.
    assert "the launch's process group" not in page.get(url).content.decode()
    form = follow(page, url, 'name="confirm"')  # the reading a worker made for the form
    assert f'value="{pid}"' not in form and "Clean up GPUs…" not in form
    # Nothing on the node looks stuck (GPU 0 serves a running launch): no GPU comes ticked.
    assert re.search(r'name="gpus" value="0"', form)
    assert not re.search(r'name="gpus" value="\d+"[^>]*checked', form)
    reading = re.search(r'name="reading" value="([^"]+)"', form).group(1)
    forged = {"gpus": [0], "foreign": [pid], "confirm_foreign": "on", "confirm": "on"}
    assert page.post(url, {**forged, "reading": reading}).status_code == 200
    assert not Cleanup.objects.exists()

    # Recorded by another way (or the launch started after the request): the worker refuses.
    for named in ([pid], []):
        job = Cleanup.objects.create(node=spare, gpus=[0], foreign_pids=named, requested_by="op2")
        steps = {s.key: s for s in cleanup.run(job.pk).steps.all()}
        assert "kill" not in steps["e"].command
        assert "sglang" not in steps["e"].output
    assert "not touched" in Cleanup.objects.get(foreign_pids=[pid]).steps.get(key="e").output
    assert str(pid) in spare.sim.ok("ps -eo pid=").split()
    assert Launch.objects.get(pk=launch.pk).status == LaunchStatus.READY
    ending.stop(launch.pk, actor=op1)


def test_a_confirmed_pid_reused_by_another_process_is_not_killed(spare):
    """The form binds each ticked PID to the process it showed (its start time): a PID that a
    new process took since is left alone, whoever holds it now."""
    simfleet("hold", "spare", "--gpu", "1", "--memory", "20GiB", "--state", spare.sim.state)
    try:
        found = holders.inspect(spare)
        holder = next(h for h in found.holders if 1 in h.gpus and h.launch_id is None)
        job = Cleanup.objects.create(
            node=spare, gpus=[1], foreign_pids=[holder.pid], requested_by="olga",
            foreign_starts={str(holder.pid): (holder.start or 0) + 1},  # another process's
        )  # fmt: skip
        step = cleanup.run(job.pk).steps.get(key="e")
        assert "kill" not in step.command and "no longer the process" in step.output
        assert str(holder.pid) in spare.sim.ok("ps -eo pid=").split()
    finally:
        simfleet("release", "spare", "--state", spare.sim.state)


def test_a_running_launch_is_stopped_not_cleaned_up_and_commands_show_no_secret(
    spare, olga, launch_workers
):
    """A node-wide cleanup neither offers nor kills a running launch's processes, and the
    command lines it shows of other processes have their secrets masked."""
    launch = launching.submit(node=spare, command=QWEN, actor=olga)
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED, timeout=90) == "ready"
    spare.sim.ok(
        "setsid python3 -c 'import time; f=open(\"/dev/nvidia1\"); time.sleep(600)' "
        "--api-key Sk-Foreign-Secret-12345 >/dev/null 2>&1 < /dev/null &"
    )
    found = holders.inspect(spare)
    assert "Sk-Foreign-Secret" not in json.dumps([h.command for h in found.holders])
    rank = next(h for h in found.holders if h.launch_id == launch.pk and h.gpus)
    job = Cleanup.objects.create(
        node=spare, gpus=[0, 1], foreign_pids=[rank.pid], requested_by="olga"
    )
    step = cleanup.run(job.pk).steps.get(key="e")
    assert "still running: stop it instead" in step.output
    assert "Sk-Foreign-Secret" not in step.output
    assert Launch.objects.get(pk=launch.pk).status == LaunchStatus.READY
    assert str(rank.pid) in spare.sim.ok("ps -eo pid=").split()
    assert ending.stop(launch.pk, actor=olga).clean
    spare.sim.run("pkill -f 'Sk-Foreign-Secret'")
