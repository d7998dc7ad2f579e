"""A multi-node launch in the database (issue 22): its parts are made, reserved and ended with
node 0's, all or none, and its nodes' lines make one log. Needs no node."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from nodes.domain import timeline
from nodes.models import Launch, LaunchProfile, ProfileRevision, Reservation
from nodes.models.choices import LaunchStatus
from nodes.workflows import ending, launching
from nodes.workflows.log_writer import Batch, LogWriter
from tests.factories import make_node, make_user

pytestmark = pytest.mark.django_db(transaction=True)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake"
TP8_2N = ["--model-path", "/m", "--tp-size", "8", "--nnodes", "2"]


@pytest.fixture
def nodes():
    return make_node("gpu-01", host_key=KEY), make_node("gpu-02", host="10.0.0.6", host_key=KEY)


def _revision(node, args=TP8_2N) -> ProfileRevision:
    profile = LaunchProfile.objects.create(name=f"p{LaunchProfile.objects.count()}", created_by="p")
    return ProfileRevision.objects.create(
        profile=profile, number=1, args=args, env={}, author="pat", node=node,
        verdict="ok", report={},
    )  # fmt: skip


def _create(nodes, revision=None, **kw) -> Launch:
    return launching.create(
        node=nodes[0],
        nodes=nodes,
        revision=revision or _revision(nodes[0]),
        actor=User.objects.filter(username="olga").first() or make_user("olga", "operator"),
        **kw,
    )


def test_each_node_gets_its_part_with_its_share_of_gpus_and_node_0_the_store_port(nodes):
    launch = _create(nodes)
    assert launch.status == LaunchStatus.PENDING
    part = launch.parts.get()
    assert (part.node, part.node_rank, launch.node_rank) == (nodes[1], 1, 0)
    assert launch.gpus == [0, 1, 2, 3] and part.gpus == [0, 1, 2, 3]

    def ports(launch: Launch) -> list[int]:
        return sorted(launch.reservations.filter(kind="port").values_list("number", flat=True))

    assert ports(launch) == [5000, 30000] and ports(part) == [30000]
    names = {c.get("node") for c in launch.checks}
    assert names == {"gpu-01", "gpu-02"}, launch.checks
    listed = launch.summary()["nodes"]
    assert isinstance(listed, list) and [n["node"] for n in listed] == ["gpu-01", "gpu-02"]


def test_a_gpu_held_on_node_1_blocks_the_group_and_reserves_nothing_anywhere(nodes):
    other = _create([nodes[1]], _revision(nodes[1], ["--model-path", "/m", "--tp-size", "2"]))
    assert sorted(other.gpus) == [0, 1]
    launch = _create(nodes, gpus=[0, 1, 2, 3])
    part = launch.parts.get()
    assert launch.status == part.status == LaunchStatus.BLOCKED
    assert launch.reason.startswith("pre-flight refused: gpu-02: already held: GPU 0")
    assert not Reservation.objects.filter(launch__in=[launch, part]).exists()
    failed = [c for c in launch.checks if not c["passed"]]
    assert [(c["name"], c["node"]) for c in failed] == [("reservation", "gpu-02")]


@pytest.mark.parametrize(
    ("group", "args", "message"),
    [
        ("twice", TP8_2N, "named twice"),
        ("one", TP8_2N, "name its 2 nodes"),
        ("two", ["--model-path", "/m", "--tp-size", "8"], "runs on 1 node \\(no --nnodes\\) but 2"),
        ("two", ["--model-path", "/m", "--tp-size", "6", "--nnodes", "4"], "--nnodes 4 but 2"),
    ],
)
def test_a_group_that_does_not_fit_the_command_is_refused_and_nothing_is_kept(
    nodes, group, args, message
):
    chosen = {"twice": [nodes[0], nodes[0]], "one": [nodes[0]], "two": list(nodes)}[group]
    revision = _revision(nodes[0], args)
    with pytest.raises(launching.LaunchInputError, match=message):
        _create(chosen, revision)
    assert not Launch.objects.exists() and not Reservation.objects.exists()


def test_a_panel_failure_while_starting_a_group_ends_every_part(nodes, monkeypatch):
    launch = _create(nodes)

    def broken(first: Launch) -> None:
        raise RuntimeError("database went away")

    monkeypatch.setattr(launching, "_start_group", broken)
    launching.start(launch.pk)
    part = launch.parts.get()
    launching.start(part.pk)  # a part is started by its group's start only: nothing happens
    assert Launch.objects.get(pk=launch.pk).status == LaunchStatus.ERROR
    assert Launch.objects.get(pk=part.pk).status == LaunchStatus.ERROR
    assert not Reservation.objects.exists()


def test_two_nodes_writers_number_one_log_in_the_order_they_commit(nodes):
    launch = _create(nodes)
    part = launch.parts.get()
    Launch.objects.filter(pk__in=[launch.pk, part.pk]).update(worker_token="t")
    zero = LogWriter(launch.pk, "t", 0, threaded=False, group_id=launch.pk, node="gpu-01")
    one = LogWriter(part.pk, "t", 0, threaded=False, group_id=launch.pk, node="gpu-02")
    zero.put(Batch([(0, "[TP0] Init torch distributed begin.", 0, "TP0")], 40))
    one.put(Batch([(0, "[TP4] Init torch distributed begin.", 0, "TP4"), (0, "x", 0, "")], 50))
    zero.put(Batch([(0, "[TP0] Load weight begin.", 0, "TP0")], 30))
    lines = list(launch.lines.order_by("seq").values_list("seq", "node", "rank"))
    assert lines == [
        (1, "gpu-01", "TP0"),
        (2, "gpu-02", "TP4"),
        (3, "gpu-02", ""),
        (4, "gpu-01", "TP0"),
    ]
    launch.refresh_from_db()
    part.refresh_from_db()
    assert (launch.last_seq, launch.log_offset, part.log_offset) == (4, 70, 50)
    assert not part.lines.exists()


def test_a_group_on_one_machine_twice_or_with_its_store_on_the_servers_port_is_refused(nodes):
    alias = make_node("gpu-02-again", host="10.0.0.6", host_key=KEY)
    with pytest.raises(launching.LaunchInputError, match="gpu-02 and gpu-02-again are the same"):
        _create([nodes[1], alias])
    clash = _revision(nodes[0], [*TP8_2N, "--port", "5000"])
    with pytest.raises(launching.LaunchInputError, match="store's port 5000"):
        _create(nodes, clash)
    assert not Launch.objects.exists()


def test_stopping_a_part_stops_the_whole_launch(nodes):
    launch = _create(nodes)
    part = launch.parts.get()
    # These nodes are not there: the stop reaches for node 1's part first and fails; node 0's
    # is then left as it was (the launch as a whole was not stopped), and both say so.
    outcome = ending.stop(part.pk, actor=make_user("stan", "operator"))
    assert outcome.launch.pk == launch.pk and outcome.error.startswith("stop failed on gpu-02")
    part.refresh_from_db()
    assert part.stop_attempts == 1 and part.reason.startswith("stop failed"), part.reason
    launch.refresh_from_db()
    assert launch.status == LaunchStatus.PENDING, launch.status
    assert launch.reason.startswith("stop failed on gpu-02: "), launch.reason


def test_a_parts_page_offers_stop_for_the_whole_launch(nodes, client):
    launch = _create(nodes)
    part = launch.parts.get()
    Launch.objects.filter(pk__in=[launch.pk, part.pk]).update(status=LaunchStatus.READY)
    client.force_login(User.objects.get(username="olga"))
    page = client.get(f"/launches/{part.pk}/").content.decode()
    assert f'action="/launches/{part.pk}/stop/"' in page
    assert "on gpu-01 (GPU 0,1,2,3), gpu-02 (GPU 0,1,2,3)" in page  # the confirm names both
    Launch.objects.filter(pk=launch.pk).update(status=LaunchStatus.STOPPED)
    assert "/stop/" not in client.get(f"/launches/{part.pk}/").content.decode()


def test_node_0s_memory_charts_say_whose_they_are(nodes, client):
    launch = _create(nodes)
    part = launch.parts.get()
    samples = [timeline.sample(t, 449 * 10**9, 400 * 10**9, {0: t * 10**9}) for t in (0, 5, 10)]
    Launch.objects.filter(pk=launch.pk).update(status=LaunchStatus.READY, memory_timeline=samples)
    client.force_login(User.objects.get(username="olga"))
    page = client.get(f"/launches/{launch.pk}/").content.decode()
    assert "Memory over the launch on gpu-01" in page
    assert "These charts are gpu-01's (node rank 0) alone" in page
    assert f'href="/launches/{part.pk}/">gpu-02' in page
