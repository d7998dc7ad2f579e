"""The ledger of a node on the simulated fleet: launches that each fit alone but not together
are refused at submission with the arithmetic that names the others; launches that fit
together all run; a commitment outlives a worker killed before the start and ends when the
launch's processes are gone."""

from __future__ import annotations

import random
import re
import threading
import time

import pytest

from nodes.models import Commitment, Launch, NodeEvent
from nodes.models.choices import LaunchStatus
from nodes.services import placement
from nodes.workflows import discovery, ending, launching
from tests.fleet import simfleet, wait_until
from tests.launching import node_fixture, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
LLAMA = "python3 -m sglang.launch_server --model-path /srv/models/llama-3-70b --tp-size 4"
LLAMA_TP2 = "python3 -m sglang.launch_server --model-path /srv/models/llama-3-70b --tp-size 2"
HICACHE = "--enable-hierarchical-cache --hicache-size"
QWEN = "python3 -m sglang.launch_server --model-path /srv/models/qwen2.5-7b --tp-size 2"

incident = node_fixture("incident")
stuck = node_fixture("stuck")


def _at_once(node, olga, commands: list[tuple[str, list[int]]]) -> list[Launch]:
    """Submit every ``(command, gpus)`` from its own thread, released together (in a random
    order); the launches in submission order, or the errors."""
    barrier = threading.Barrier(len(commands))
    results: dict[int, Launch | BaseException] = {}

    def submit(i: int, command: str, gpus: list[int]) -> None:
        from django.db import connection

        try:
            barrier.wait()
            time.sleep(random.uniform(0, 0.05))
            results[i] = launching.submit(node=node, command=command, actor=olga, gpus=gpus)
        except BaseException as exc:  # noqa: BLE001 — reported by the test
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=submit, args=(i, c, g)) for i, (c, g) in enumerate(commands)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    launches = [results[i] for i in range(len(commands))]
    assert all(isinstance(x, Launch) for x in launches), launches
    return [x for x in launches if isinstance(x, Launch)]


def _halves(command: str) -> list[tuple[str, list[int]]]:
    """``command`` on GPUs 0–3 and on 4–7 of an 8-GPU node, on ports of their own."""
    return [(f"{command} --port 30000", [0, 1, 2, 3]), (f"{command} --port 30100", [4, 5, 6, 7])]


def _settle(launch: Launch) -> str:
    return wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED, LaunchStatus.BLOCKED)


def _stop_all(launches: list[Launch], olga) -> None:
    for launch in launches:
        launch.refresh_from_db()
        if launch.status not in (LaunchStatus.BLOCKED, LaunchStatus.FAILED, LaunchStatus.STOPPED):
            assert ending.stop(launch.pk, actor=olga).clean


def test_the_issues_experiment_the_second_launch_is_blocked_naming_the_first(
    incident, olga, launch_workers
):
    """Two llama-3-70b launches at TP 4 with 105 GB per rank on one 449 GB node, submitted in
    the same second on GPUs 0–3 and 4–7: 420 + 420 GB do not fit, one is refused."""
    launches = _at_once(incident, olga, _halves(f"{LLAMA} {HICACHE} 105"))
    try:
        outcomes = sorted(((_settle(x), x) for x in launches), key=lambda o: o[0])
        (blocked, loser), (ready, winner) = outcomes
        assert (blocked, ready) == (LaunchStatus.BLOCKED, LaunchStatus.READY), loser.reason
        assert f"launch #{winner.pk} (ad-hoc" in loser.reason and "420 GB" in loser.reason
        assert not Commitment.objects.filter(launch=loser, released__isnull=True).exists()
        assert Launch.objects.filter(status=LaunchStatus.FAILED).count() == 0  # no OOM kill
    finally:
        _stop_all(launches, olga)
    assert not Commitment.objects.filter(released__isnull=True).exists()
    # Sizes that fit together: both run.
    launches = _at_once(incident, olga, _halves(f"{LLAMA} {HICACHE} 50"))
    try:
        assert [_settle(x) for x in launches] == [LaunchStatus.READY] * 2, [
            x.reason for x in launches
        ]
    finally:
        _stop_all(launches, olga)


def test_four_launches_of_which_any_three_fit_exactly_three_run(incident, olga, launch_workers):
    """Four llama-3-70b launches of 2 × 70 GB each on GPU pairs, submitted together in a random
    order: any three fit the node's 449 GB, four do not. Three run, none is OOM-killed, and
    the refusal names the other three."""
    command = f"{LLAMA_TP2} {HICACHE} 70"
    pairs = [[0, 1], [2, 3], [4, 5], [6, 7]]
    random.shuffle(pairs)
    launches = _at_once(
        incident, olga, [(f"{command} --port {30000 + 100 * i}", g) for i, g in enumerate(pairs)]
    )
    try:
        outcomes = {x.pk: _settle(x) for x in launches}
        reasons = [Launch.objects.get(pk=x.pk).reason for x in launches]
        assert sorted(outcomes.values()) == sorted([LaunchStatus.READY] * 3 + ["blocked"]), reasons
        (loser,) = [x for x in launches if outcomes[x.pk] == LaunchStatus.BLOCKED]
        loser.refresh_from_db()
        for other in launches:
            if other.pk != loser.pk:
                assert f"launch #{other.pk} (" in loser.reason, loser.reason
    finally:
        _stop_all(launches, olga)


def test_a_commitment_outlives_a_worker_killed_before_the_start(incident, olga, launch_workers):
    """Submitted while no worker takes starts: the commitment is there at once (another launch
    that does not fit beside it is refused), the launch starts once a worker is back, and its
    commitment ends with its processes; then the other fits."""
    big = f"{LLAMA} {HICACHE} 105"
    launch_workers.kill("default")
    try:
        first = launching.submit(node=incident, command=big, actor=olga, gpus=[0, 1, 2, 3])
        assert first.status == LaunchStatus.PENDING
        held = Commitment.objects.get(launch=first, released__isnull=True)
        assert held.host_bytes == 420 * 10**9
        second = launching.submit(
            node=incident, command=f"{big} --port 30100", actor=olga, gpus=[4, 5, 6, 7]
        )
        assert second.status == LaunchStatus.BLOCKED and f"#{first.pk}" in second.reason
    finally:
        launch_workers.start("default")
    assert _settle(first) == LaunchStatus.READY, first.reason
    assert ending.stop(first.pk, actor=olga).clean
    assert not Commitment.objects.filter(launch=first, released__isnull=True).exists()
    third = launching.submit(
        node=incident, command=f"{big} --port 30100", actor=olga, gpus=[4, 5, 6, 7]
    )
    try:
        assert _settle(third) == LaunchStatus.READY, third.reason
    finally:
        _stop_all([third], olga)


def test_placement_passes_over_a_gpu_a_foreign_process_holds_and_says_why(incident, olga):
    """``simfleet hold`` starts a process outside Rankwise holding 10 GiB of GPU 2; after one
    heartbeat, placement of a TP-4 launch takes GPUs 0, 1, 3 and 4 and says why not 2."""
    revision = launching.adhoc_revision(LLAMA, incident, olga)
    simfleet("hold", "incident", "--gpu", "2", "--memory", "10GiB", "--state", incident.sim.state)
    try:
        discovery.heartbeat_sweep(timeout=10)
        found = placement.place(revision, olga, wait=None)
    finally:
        simfleet("release", "incident", "--state", incident.sim.state)
    (best,) = found.candidates
    assert best.node == "incident" and best.gpus == [0, 1, 3, 4], best
    (why,) = [r for r in best.reasons if r.startswith("GPU 2:")]
    assert re.fullmatch(
        r"GPU 2: held by a foreign process \(PID [0-9]+, root, \S*python3\S*, 10 GiB\) "
        r"\(passed over\)",
        why,
    ), why


def test_an_escaped_rank_is_reported_within_one_heartbeat(stuck, olga, launch_workers):
    """The server of a launch is killed; its ranks, frozen while unpinning (the stuck-on-kill
    fault), are re-parented and go on holding both GPUs after the launch ended ``failed``: the
    next heartbeat raises a node event naming the launch, its GPU and the process; its host
    memory stays committed until a heartbeat after the node's reboot finds the ranks gone."""
    launch = launching.submit(
        node=stuck, command=f"{QWEN} --mem-fraction-static 0.5 {HICACHE} 40", actor=olga
    )
    assert _settle(launch) == LaunchStatus.READY, launch.reason
    stuck.sim.ok("pkill -KILL -f '^sglang::http_server'")
    try:
        assert wait_for(launch, LaunchStatus.FAILED, timeout=90) == LaunchStatus.FAILED
        wait_until(lambda: "D" in stuck.sim.ok("ps -eo stat=; true"), 30)
        discovery.heartbeat_sweep(timeout=10)
        said = list(
            NodeEvent.objects.filter(node=stuck, kind="escaped").values_list("message", flat=True)
        )
        assert {m.split(":")[0] for m in said} == {"GPU 0", "GPU 1"}, said
        assert all(f"of launch #{launch.pk} (failed) still holds memory" in m for m in said), said
        # Once: the next heartbeat does not say it again.
        discovery.heartbeat_sweep(timeout=10)
        assert NodeEvent.objects.filter(node=stuck, kind="escaped").count() == len(said)
        # Its host memory stays committed while its ranks live, and comes back with them.
        assert Commitment.objects.filter(launch=launch, released__isnull=True).exists()
        stuck.sim.reboot()
        discovery.heartbeat_sweep(timeout=10)
        assert not Commitment.objects.filter(launch=launch, released__isnull=True).exists()
    finally:
        stuck.sim.reboot()
