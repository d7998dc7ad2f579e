"""On the simulated fleet: a profile's environment cannot run code the command does not show,
and a node can run its servers as an unprivileged user."""

from __future__ import annotations

import pytest
from django.db import transaction

from nodes.models import Launch, LaunchLogLine, LaunchProfile, Node, ProfileRevision
from nodes.models.choices import LaunchStatus
from nodes.workflows import discovery, ending, launching
from tests.conftest import register_sim_node
from tests.factories import make_user
from tests.fleet import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
SMALL = ["--model-path", "/srv/models/qwen2.5-7b", "--tp-size", "2"]
# The adversarial pass's reproduction: the interpreter imports ``antigravity`` for the warning
# filter's category, which opens $BROWSER, a shell command line.
ATTACK = {
    "PYTHONWARNINGS": "ignore::antigravity.x",
    "BROWSER": "/bin/sh -c 'id > pwned.txt' #%s",
}


@pytest.fixture
def spare(sim_fleet):
    sim = sim_fleet["spare"]
    sim.make_clean()
    # The node's disk outlives reboots, as a real one does: the markers an earlier test's launch
    # left (the attack allowed on purpose) are not this test's to find.
    sim.ok("find ~/.rankwise /tmp -name pwned.txt -delete 2>/dev/null; true")
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    node.refresh_from_db()
    node.sim = sim
    return node


@pytest.fixture
def olga(db):
    return make_user("olga", "operator")


def stored_revision(node: Node, env: dict[str, str]) -> ProfileRevision:
    """A revision as one saved before the policy existed (written straight to the table)."""
    profile = LaunchProfile.objects.create(name="hooked", created_by="olga")
    return ProfileRevision.objects.create(
        profile=profile, number=1, args=SMALL, env=env, node=node, verdict="ok", report={}
    )


def marker_files(sim) -> str:
    """Marker files where a server could write: its launch folders and the temporary folder."""
    found: str = sim.ok("find ~/.rankwise /tmp -name pwned.txt 2>/dev/null; true")
    return found.strip()


def wait_for(launch: Launch, *statuses: str, timeout: float = 90) -> str:
    wait_until(lambda: Launch.objects.get(pk=launch.pk).status in statuses, timeout, 0.3)
    launch.refresh_from_db()
    return launch.status


def test_a_stored_revision_with_hooks_never_runs_them_on_the_node(spare, olga, launch_workers):
    revision = stored_revision(spare, ATTACK)
    with pytest.raises(launching.LaunchInputError) as refused:
        launching.submit(node=spare, revision=revision, actor=olga)
    assert "BROWSER is refused" in str(refused.value)
    assert "PYTHONWARNINGS is refused" in str(refused.value)
    assert not Launch.objects.exists()
    # Queued while an admin allowed them, withdrawn before the worker starts it: the worker's
    # own check refuses it just before anything would run.
    Node.objects.filter(pk=spare.pk).update(allowed_env=["BROWSER", "PYTHONWARNINGS"])
    spare.refresh_from_db()
    with transaction.atomic():  # the start is queued when this block commits
        launch = launching.submit(node=spare, revision=revision, actor=olga)
        Node.objects.filter(pk=spare.pk).update(allowed_env=[])
    assert wait_for(launch, LaunchStatus.BLOCKED, LaunchStatus.READY, LaunchStatus.FAILED) == (
        LaunchStatus.BLOCKED
    )
    assert "environment: BROWSER is refused" in launch.reason
    assert launch.pid is None
    assert marker_files(spare.sim) == ""


def test_a_node_runs_its_servers_as_its_unprivileged_user(spare, olga, launch_workers):
    assert spare.sim.ok("id -u nobody").strip() == "65534"  # the node's unprivileged account
    # The attack allowed by an admin on purpose: it shows whose rights a server's code gets.
    Node.objects.filter(pk=spare.pk).update(
        run_as_user="nobody", allowed_env=["BROWSER", "PYTHONWARNINGS"]
    )
    spare.refresh_from_db()
    launch = launching.submit(node=spare, revision=stored_revision(spare, ATTACK), actor=olga)
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED, LaunchStatus.BLOCKED) == (
        LaunchStatus.READY
    ), launch.reason
    assert spare.sim.ok(f"ps -o user= -p {launch.pid}").strip() == "nobody"
    ranks = spare.sim.ok("ps -eo user=,args= | grep '^[a-z]* *sglang::' || true").splitlines()
    assert ranks and all(line.split()[0] == "nobody" for line in ranks), ranks
    marker = spare.sim.ok(f"cat {launch.remote_dir}/work/pwned.txt")
    assert marker.startswith("uid=65534(nobody)"), marker  # not root
    assert marker_files(spare.sim).endswith(f"{launch.remote_dir.split('/')[-1]}/work/pwned.txt")
    assert LaunchLogLine.objects.filter(launch=launch).exists()  # the log still streams
    assert ending.stop(launch.pk, actor=olga).clean
    assert spare.sim.ok(f"stat -c %U {launch.remote_dir}/pid").strip() == "root"


def test_a_run_as_user_missing_on_the_node_blocks_the_launch_with_the_reason(
    spare, olga, launch_workers
):
    Node.objects.filter(pk=spare.pk).update(run_as_user="rankwise-absent")
    spare.refresh_from_db()
    launch = launching.submit(node=spare, revision=stored_revision(spare, {}), actor=olga)
    assert wait_for(launch, LaunchStatus.BLOCKED, LaunchStatus.READY, LaunchStatus.FAILED) == (
        LaunchStatus.BLOCKED
    )
    assert "cannot run servers as 'rankwise-absent': no such user on this node" in launch.reason
    assert launch.pid is None
