"""Launch steps that need no node: a panel failure, the reconciler's choice of orphans."""

from __future__ import annotations

import base64
import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from nodes.domain.logparse import Progress
from nodes.domain.logtext import Piece
from nodes.models import (
    AuditEntry,
    Launch,
    LaunchLogLine,
    LaunchProfile,
    Node,
    ProfileRevision,
    Reservation,
)
from nodes.models.choices import LaunchStatus
from nodes.services import launch_flags, launch_state
from nodes.tasks import stop_launch
from nodes.workflows import ending, launching, reconciling
from nodes.workflows.following import Follower
from nodes.workflows.log_writer import Batch, LeaseLost, LogWriter
from tests.factories import make_node, make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def launch():
    node = make_node("gpu-01", host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake")
    profile = LaunchProfile.objects.create(name="qwen", created_by="pat")
    revision = ProfileRevision.objects.create(
        profile=profile,
        number=1,
        args=["--model-path", "/m", "--tp-size", "2"],
        env={},
        author="pat",
        node=node,
        verdict="ok",
        report={},
    )
    return launching.create(node=node, revision=revision, actor=make_user("olga", "operator"))


def test_a_panel_failure_while_starting_is_an_error_and_frees_the_gpus(launch, monkeypatch):
    def broken(launch_id: int) -> None:
        raise RuntimeError("database went away")

    monkeypatch.setattr(launching, "_start", broken)
    launching.start(launch.pk)
    launch.refresh_from_db()
    assert launch.status == LaunchStatus.ERROR
    assert "RuntimeError: database went away" in launch.reason
    assert not Reservation.objects.filter(launch=launch).exists()


def test_the_reconciler_adopts_only_launches_whose_worker_is_silent(launch, settings):
    stale = timezone.now() - timedelta(seconds=settings.RANKWISE_FOLLOWER_LEASE_SECONDS + 5)
    Launch.objects.filter(pk=launch.pk).update(
        status=LaunchStatus.READY, worker_token="w1", worker_beat=timezone.now(), started=stale
    )
    assert reconciling.orphans() == []
    Launch.objects.filter(pk=launch.pk).update(worker_beat=stale)
    assert [o.pk for o in reconciling.orphans()] == [launch.pk]
    Launch.objects.filter(pk=launch.pk).update(
        status=LaunchStatus.STOPPED, ended=timezone.now(), log_complete=True
    )
    assert reconciling.orphans() == []


def test_a_second_worker_cannot_take_a_fresh_lease(launch):
    assert launch_state.claim(launch.pk, "first", (LaunchStatus.PENDING,))
    assert not launch_state.claim(launch.pk, "second", (LaunchStatus.PENDING,))
    assert launch_state.claim(launch.pk, "first", (LaunchStatus.PENDING,))


def test_retention_keeps_the_first_and_the_newest_lines(launch, settings):
    settings.RANKWISE_LOG_LINES_MAX = 1200
    follower = Follower(launch.pk)
    assert launch_state.claim(launch.pk, follower.token, (LaunchStatus.PENDING,))
    follower.offset, follower.seq, follower.secrets = 0, 0, []
    follower.progress = Progress()
    follower.writer = LogWriter(launch.pk, follower.token, 0, threaded=False)
    for batch in range(30):
        pieces = [Piece(f"line {batch * 100 + i + 1}", 10) for i in range(100)]
        follower._store(launch, pieces)
    launch.refresh_from_db()
    kept = list(LaunchLogLine.objects.filter(launch=launch).values_list("seq", flat=True))
    assert kept == list(range(1, 1001)) + list(range(2801, 3001))
    assert launch.last_seq == 3000 and launch.lines_dropped == 1800
    assert launch.log_offset == 30000


def test_the_writer_stores_batches_in_order_off_the_caller_and_stops_at_a_lost_lease(launch):
    assert launch_state.claim(launch.pk, "mine", (LaunchStatus.PENDING,))
    writer = LogWriter(launch.pk, "mine", 0)
    for batch in range(50):
        rows = [(batch * 10 + i + 1, f"line {batch * 10 + i + 1}", 0, "") for i in range(10)]
        writer.put(Batch(rows, 100, {"phase": "weights"} if batch == 20 else None))
    writer.flush()
    launch.refresh_from_db()
    stored = list(LaunchLogLine.objects.filter(launch=launch).values_list("seq", "text"))
    assert stored == [(n, f"line {n}") for n in range(1, 501)]
    assert (launch.last_seq, launch.log_offset) == (500, 5000)
    assert launch.progress == {"phase": "weights"}
    first = LaunchLogLine.objects.get(launch=launch, seq=1)
    assert timezone.now() - timedelta(minutes=1) < first.time <= timezone.now()
    # Another follower took the launch over: this writer stores nothing more and says so.
    Launch.objects.filter(pk=launch.pk).update(worker_token="theirs")
    writer.put(Batch([(501, "line 501", 0, "")], 10))
    with pytest.raises(LeaseLost):
        writer.close()
    assert LaunchLogLine.objects.filter(launch=launch).count() == 500


def test_a_second_stop_waits_for_the_first_and_acts_only_once(launch):
    import threading

    from nodes.models import AuditEntry

    # A live stop: its worker checks in (the lease); a stale one would be taken over.
    Launch.objects.filter(pk=launch.pk).update(
        status=LaunchStatus.STOPPING, stop_token="first", stop_beat=timezone.now()
    )

    def first_stop_finishes() -> None:
        from django.db import connection

        Launch.objects.filter(pk=launch.pk).update(status=LaunchStatus.STOPPED)
        connection.close()

    timer = threading.Timer(1.0, first_stop_finishes)
    timer.start()
    outcome = ending.stop(launch.pk, actor=make_user("pat", "operator"))
    timer.join()
    assert outcome.launch.status == LaunchStatus.STOPPED and not outcome.error
    assert not AuditEntry.objects.filter(action="launch.stop").exists()


def test_a_launch_can_move_the_server_to_another_port(launch):
    moved = launching.create(
        node=launch.node,
        revision=launch.revision,
        actor=make_user("pat", "operator"),
        gpus=[4, 5],
        port=31000,
    )
    assert moved.status == LaunchStatus.PENDING and moved.port == 31000
    assert launch_flags.args_of(moved)[-2:] == ["--port", "31000"]
    assert set(moved.reservations.values_list("kind", "number")) == {
        ("gpu", 4),
        ("gpu", 5),
        ("port", 31000),
    }


def test_a_numeric_api_key_masks_its_echo_but_not_the_numbers_the_parser_reads(launch):
    from nodes.domain.redact import secret_values

    follower = Follower(launch.pk)
    assert launch_state.claim(launch.pk, follower.token, (LaunchStatus.PENDING,))
    follower.offset, follower.seq = 0, 0
    follower.writer = LogWriter(launch.pk, follower.token, 0, threaded=False)
    follower.secrets = secret_values(["--api-key", "100000", "--max-total-tokens", "100000"], {})
    follower.progress = Progress()
    lines = [
        "server_args=ServerArgs(api_key='100000', max_total_tokens=100000)",
        "[2026-12-01 10:00:00 TP0] max_total_num_tokens=100000, chunked_prefill_size=8192",
    ]
    follower._store(launch, [Piece(text, len(text) + 1) for text in lines])
    stored = list(LaunchLogLine.objects.filter(launch=launch).values_list("text", flat=True))
    assert stored == [
        "server_args=ServerArgs(api_key='****', max_total_tokens=100000)",
        lines[1],
    ]
    launch.refresh_from_db()
    assert Progress.from_json(launch.progress).numbers["max_total_num_tokens"] == 100000


def test_a_stop_whose_worker_went_silent_is_found_and_taken_over(launch, settings):
    stale = timezone.now() - timedelta(seconds=settings.RANKWISE_FOLLOWER_LEASE_SECONDS + 5)
    Launch.objects.filter(pk=launch.pk).update(
        status=LaunchStatus.STOPPING, stop_token="dead-worker", stop_beat=timezone.now()
    )
    assert reconciling.stuck_stops() == []
    Launch.objects.filter(pk=launch.pk).update(stop_beat=stale)
    assert [s.pk for s in reconciling.stuck_stops()] == [launch.pk]
    # A second stop does not wait for the dead one: it tries the node itself (here: a port
    # where nothing listens, no retry left, so the stop is reported failed and the launch gets
    # its status back).
    Launch.objects.filter(pk=launch.pk).update(resume_status=LaunchStatus.READY)
    blob = b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + bytes(32)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    Node.objects.filter(pk=launch.node_id).update(
        host="127.0.0.1", port=port, host_key=f"ssh-ed25519 {base64.b64encode(blob).decode()}"
    )
    outcome = ending.stop(launch.pk, actor=make_user("pat", "operator"))
    assert outcome.error.startswith("stop failed after 1 attempt"), outcome.error
    assert outcome.launch.status == LaunchStatus.READY
    assert outcome.launch.reason == outcome.error and reconciling.stuck_stops() == []


def test_stop_retries_back_off_and_are_bounded(settings):
    settings.RANKWISE_STOP_RETRIES, settings.RANKWISE_STOP_RETRY_SECONDS = 8, 5
    waits = [ending.stop_retry_in(attempts) for attempts in range(1, 10)]
    assert waits == [5, 10, 20, 40, 80, 120, 120, 120, None]


def _unreachable(node_id: int) -> None:
    """Point the node at a local port where nothing listens: every attempt is refused."""
    blob = b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + bytes(32)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    Node.objects.filter(pk=node_id).update(
        host="127.0.0.1", port=port, host_key=f"ssh-ed25519 {base64.b64encode(blob).decode()}"
    )


def test_a_stop_retry_chain_counts_on_across_a_requeue_and_ends_bounded(settings):
    """The adversarial pass: a stop's worker killed while the node was away; the reconciler's
    new stop restarted the backoff, went on from the wrong attempt, and the task crashed with
    MaxRetriesExceededError while the launch said "retrying". Here: attempts 1-2 by the first
    stop, its worker dies, the reconciler's stop goes on at attempt 3 and the chain ends after
    RANKWISE_STOP_RETRIES retries, reported on the launch."""
    settings.RANKWISE_STOP_RETRIES, settings.RANKWISE_STOP_RETRY_SECONDS = 3, 1
    node = make_node("gpu-01")
    profile = LaunchProfile.objects.create(name="qwen", created_by="pat")
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, args=["--model-path", "/m"], env={}, author="pat", node=node,
        verdict="ok", report={},
    )  # fmt: skip
    # A ready launch (made here, not by ``create``: no start task races the worker).
    launch = Launch.objects.create(
        revision=revision, node=node, gpus=[0], port=30000, created_by="pat",
        startup_timeout_s=60, status=LaunchStatus.READY,
    )  # fmt: skip
    _unreachable(node.pk)
    pat = make_user("pat", "operator")
    first = ending.stop(launch.pk, actor=pat, token="t1", retries=True)
    assert first.pending and first.retry_in == 1
    assert "retrying (attempt 2) in 1 s" in first.launch.reason
    second = ending.stop(launch.pk, actor=pat, token="t1", retries=True)
    assert second.pending and "retrying (attempt 3) in 2 s" in second.launch.reason
    # Its worker dies holding the retry: the lease goes stale after the due time.
    assert reconciling.stuck_stops() == []
    stale = timezone.now() - timedelta(seconds=settings.RANKWISE_FOLLOWER_LEASE_SECONDS + 5)
    Launch.objects.filter(pk=launch.pk).update(stop_beat=stale)
    assert [s.pk for s in reconciling.stuck_stops()] == [launch.pk]
    # The stop the reconciler queues, run here in this process with its Celery retries.
    result = stop_launch.apply(args=(launch.pk, pat.pk))
    assert result.state in ("SUCCESS", "RETRY"), result.traceback
    launch.refresh_from_db()
    # Attempt 3 by the new stop (retried after 4 s, where the chain was) and attempt 4, the
    # last (3 retries): the stop is reported failed on the launch.
    assert launch.status == LaunchStatus.READY
    assert launch.reason.startswith("stop failed after 4 attempts"), launch.reason
    assert launch.stop_attempts == 4 and launch.stop_token == ""
    entry = AuditEntry.objects.get(action="launch.stop_failed")
    assert entry.after["attempts"] == 4


def test_ranks_stopped_because_another_node_was_lost_do_not_fail_the_lost_launch(launch):
    """Node 0's follower read its launch as ready just before another node's follower marked
    the group lost and stopped node 0's ranks: the ranks it then finds gone were stopped on
    purpose, so the launch stays lost (it ends failed only once the lost node answers)."""
    from nodes.remote.client import GroupStatus

    Launch.objects.filter(pk=launch.pk).update(status=LaunchStatus.READY)
    follower = Follower(launch.pk)
    seen = Launch.objects.get(pk=launch.pk)  # what the follower read, ready
    rank = {
        "pid": 4242,
        "command": "sglang::scheduler_TP0",
        "state": "S",
        "name": "sglang::schedul",
    }

    def group(members: list) -> GroupStatus:
        return GroupStatus(
            dir="/d", exists=True, launch_id=str(launch.pk), pid=1, pgid=1, exit_status=None,
            log="/d/log", log_size=0, alive=True, members=members,
        )  # fmt: skip

    follower.ranks_seen = {}
    follower._check_ranks(seen, group([rank]))
    Launch.objects.filter(pk=launch.pk).update(status=LaunchStatus.LOST, reason="pb lost")
    follower._check_ranks(seen, group([]))
    launch.refresh_from_db()
    assert (launch.status, launch.reason) == (LaunchStatus.LOST, "pb lost")
