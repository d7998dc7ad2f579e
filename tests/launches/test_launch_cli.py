"""The launch CLI as an operator runs it: a subprocess, through real Celery workers."""

from __future__ import annotations

import json
import subprocess

import pytest

from nodes.models import AuditEntry, Launch, LaunchProfile
from nodes.services.model_facts import model_facts
from nodes.services.profiles import evaluate, save_revision
from nodes.workflows import discovery
from tests.conftest import TEST_REDIS_URL, manage_in_process, manage_py, register_sim_node
from tests.factories import make_user
from tests.fleet import simfleet, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
QWEN = ["--model-path", "/srv/models/qwen2.5-7b", "--tp-size", "2"]
SERVER = ["python3", "-m", "sglang.launch_server"]


@pytest.fixture
def cli(settings):
    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return manage_py(settings, *args, env={"REDIS_URL": TEST_REDIS_URL}, timeout=timeout)

    return run


@pytest.fixture
def spare(sim_fleet):
    sim = sim_fleet["spare"]
    sim.make_clean()
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    node.refresh_from_db()
    node.sim = sim
    make_user("olga", "operator")
    return node


def test_blocked_preflight_exits_2_with_the_checks_as_json(cli, spare, launch_workers):
    simfleet("hold", "spare", "--gpu", "0", "--memory", "10GiB", "--state", spare.sim.state)
    try:
        done = cli("launch", "--node", "spare", "--actor", "olga", "--json", "--", *SERVER, *QWEN)
    finally:
        simfleet("release", "spare", "--state", spare.sim.state)
    assert done.returncode == 2, done.stderr
    doc = json.loads(done.stdout)  # stdout holds only the JSON
    assert doc["status"] == "blocked" and isinstance(doc["id"], int)
    assert {"name", "passed", "detail"} <= set(doc["checks"][0])
    failed = [c for c in doc["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["gpus_idle"]
    assert "PID" in failed[0]["detail"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node", "nowhere", "--", *SERVER, *QWEN], "no node named"),
        (["--node", "spare"], "either --profile"),
        (["--node", "spare", "--profile", "x", "--", *SERVER, *QWEN], "either --profile"),
        (["--node", "spare", "--override", "budget", "--", *SERVER, *QWEN], "--reason"),
        (
            ["--node", "spare", "--override", "reservation", "--reason", "r", "--", *SERVER, *QWEN],
            "cannot override reservation",
        ),
        (["--node", "spare", "--gpus", "0", "--", *SERVER, *QWEN], "needs 2 GPU"),
        (["--node", "spare", "--gpus", "zero", "--", *SERVER, *QWEN], "--gpus"),
        (["--node", "spare", "--timeout", "-1", "--", *SERVER, *QWEN], "--timeout"),
        (["--node", "spare", "--profile", "missing@1"], "no profile named"),
        (["--node", "spare", "--", *SERVER, "--model-path", "/m", "--nnodes", "2"], "multi-node"),
        (["--node", "spare", "--", *SERVER, *QWEN, "--port", "0"], "not a TCP port"),
        (["--node", "spare", "--", *SERVER, *QWEN, "--port", "70000"], "not a TCP port"),
        (["--node", "spare", "--", *SERVER, *QWEN, "--nccl-port", "-5"], "not a TCP port"),
        (
            ["--node", "spare", "--", *SERVER, "--model-path", "/m", "--tp-size", "abc"],
            "invalid int value",
        ),
        (["--node", "spare", "--gpus", "0,0", "--", *SERVER, *QWEN], "listed twice"),
        (["--node", "spare", "--gpus", "\u0661", "--", *SERVER, *QWEN], "expected GPU indexes"),
        (["--node", "spare", "--profile", "x@\u00b2"], "must be a number"),
        (
            ["--node", "spare", "--", "X$(touch /tmp/pwn)=1", *SERVER, *QWEN],
            "not an environment variable name",
        ),
        (["--node", "spare", "--", "rm", "-rf", "/x", "&&", *SERVER, *QWEN], "would not be run"),
        (
            [
                "--node",
                "spare",
                "--override",
                "shm",
                "--reason",
                "a",
                "--override",
                "shm",
                "--reason",
                "b",
                "--",
                *SERVER,
                *QWEN,
            ],
            "given twice",
        ),
        (["--node", "spare", "--timeout", "1e30", "--", *SERVER, *QWEN], "between 1 and"),
        (["--node", "spare", "--", *SERVER, *QWEN, "--nccl-port", "0"], "is not a TCP port"),
        (["--node", "spare", "--", *SERVER, *QWEN, "$(id)"], "unrecognized arguments: $(id)"),
    ],
)
def test_unusable_input_exits_2_with_one_line_and_creates_nothing(spare, args, message):
    # In this process: the refusals are the command's own; test_one_refusal_from_a_real_process
    # keeps the entry point itself tested.
    done = manage_in_process("launch", "--actor", "olga", *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not Launch.objects.exists() and not LaunchProfile.objects.exists()


def test_one_refusal_from_a_real_process(cli, spare):
    done = cli(
        "launch", "--actor", "olga", "--node", "spare", "--gpus", "0,0", "--", *SERVER, *QWEN
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "listed twice" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not Launch.objects.exists()


def test_wait_ready_then_list_log_and_stop(cli, spare, launch_workers):
    operator = make_user("pat", "operator")
    args = [*QWEN, "--enable-metrics"]
    report = evaluate(args, spare, model_facts(spare, "/srv/models/qwen2.5-7b"))
    save_revision(
        profile_name="qwen",
        args=args,
        env={},
        message="",
        node=spare,
        report=report,
        model=model_facts(spare, "/srv/models/qwen2.5-7b"),
        actor=operator,
    )
    done = cli(
        "launch",
        "--node",
        "spare",
        "--profile",
        "qwen@1",
        "--wait",
        "ready",
        "--json",
        "--actor",
        "olga",
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    doc = json.loads(done.stdout)
    assert doc["status"] == "ready" and doc["profile"] == "qwen@1" and doc["reason"] == ""
    assert doc["server_info"]["tp_size"] == 2
    # /metrics is read at ready and on every health poll after it.
    launch = wait_until(lambda: (row := Launch.objects.get(pk=doc["id"])).metrics and row, 20, 0.3)
    assert launch and "token_usage" in launch.metrics

    listed = json.loads(cli("launches", "--json").stdout)
    assert [(row["id"], row["status"]) for row in listed] == [(launch.pk, "ready")]
    log = cli("launch-log", str(launch.pk))
    assert log.returncode == 0 and "The server is fired up and ready to roll!" in log.stdout

    stopped = cli("stop", str(launch.pk), "--json", "--actor", "olga")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["status"] == "stopped"
    followed = cli("launch-log", str(launch.pk), "--follow", timeout=60)
    assert followed.returncode == 0 and "Shutting down" in followed.stdout


def test_wait_ready_past_the_timeout_exits_1_and_the_launch_failed(cli, spare, launch_workers):
    done = cli(
        "launch",
        "--node",
        "spare",
        "--wait",
        "ready",
        "--timeout",
        "1",
        "--json",
        "--actor",
        "olga",
        "--",
        *SERVER,
        "--model-path",
        "/srv/models/llama-3-70b",
        "--tp-size",
        "2",
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    doc = json.loads(done.stdout)
    assert doc["status"] == "failed" and "within 1 s" in doc["reason"]


def test_wait_end_exits_1_when_the_server_dies(cli, spare, launch_workers):
    # A flag this SGLang refuses, let through: the server exits at once with argparse's error.
    done = cli(
        "launch",
        "--node",
        "spare",
        "--wait",
        "end",
        "--json",
        "--actor",
        "olga",
        "--override",
        "sglang",
        "--reason",
        "testing the failure path",
        "--",
        *SERVER,
        *QWEN,
        "--no-such-flag",
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    doc = json.loads(done.stdout)
    assert doc["status"] == "failed" and "exited with status 2" in doc["reason"]
    log = cli("launch-log", str(doc["id"]))
    assert "unrecognized arguments: --no-such-flag" in log.stdout


def test_a_secret_in_a_refused_flag_never_shows(cli, spare, launch_workers):
    done = cli(
        "launch",
        "--node",
        "spare",
        "--actor",
        "olga",
        "--json",
        "--",
        *SERVER,
        *QWEN,
        "--api-keys",
        "SEKRETKS2",
        "--ap",
        "SEKRETAP1",
    )
    # Refused up front, as the profile doors refuse it: nothing saved, the secret not echoed.
    assert done.returncode == 2, done.stderr
    assert "SEKRET" not in done.stdout + done.stderr and "refuses it" in done.stderr
    assert not Launch.objects.exists() and not LaunchProfile.objects.exists()
    audit = json.dumps(list(AuditEntry.objects.values("before", "after")), default=str)
    assert "SEKRET" not in audit
