"""One owner for a launch's status: the transition table walked pair by pair, the one function
that writes a status (conditional, ``ended``, audited), and no other status write in the code."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from nodes.models import AuditEntry, Launch, LaunchProfile, ProfileRevision, Reservation
from nodes.models.choices import LAUNCH_ENDED, LaunchStatus
from nodes.services import launch_state
from nodes.workflows import launching
from tests.factories import make_node

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
STATUSES = [s.value for s in LaunchStatus]


def _launch(status: str) -> Launch:
    node = make_node(f"n-{Launch.objects.count()}")
    profile = LaunchProfile.objects.create(name=f"p-{Launch.objects.count()}", created_by="pat")
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, args=["--model-path", "/m"], env={}, author="pat",
        node=node, verdict="ok", report={},
    )  # fmt: skip
    return Launch.objects.create(
        revision=revision,
        node=node,
        gpus=[0],
        port=30000,
        created_by="pat",
        startup_timeout_s=60,
        status=status,
    )


@pytest.mark.parametrize(("source", "to"), list(itertools.product(STATUSES, STATUSES)))
def test_the_table_decides_every_pair(source, to):
    launch = _launch(source)
    allowed = launch_state.allowed(source, to)
    assert (source in launch_state.sources(to)) is allowed
    if not allowed:
        with pytest.raises(launch_state.TransitionRefused):
            launch_state.transition(launch.pk, to, frm=[source])
    # With the table's own sources: moved exactly when the table allows it.
    left = launch_state.transition(launch.pk, to, reason="walked")
    launch.refresh_from_db()
    assert left == (source if allowed else None)
    assert launch.status == (to if allowed else source)
    assert (launch.ended is not None) is (allowed and to in LAUNCH_ENDED)
    audited = AuditEntry.objects.filter(action="launch.status", object_id=str(launch.pk))
    assert audited.exists() is (allowed and source != to)
    if allowed and source != to:
        entry = audited.get()
        assert entry.before == {"status": source} and entry.after == {"status": to}


def test_an_ended_status_is_final():
    for ended in LAUNCH_ENDED:
        assert launch_state.TRANSITIONS[ended] == frozenset()


def test_a_stopped_launch_cannot_become_blocked():
    launch = _launch(LaunchStatus.STOPPED)
    Reservation.objects.create(node=launch.node, kind="port", number=30000, launch=launch)
    # What pre-flight does when it refuses a launch that was stopped meanwhile.
    launching._block(launch, [{"name": "budget", "passed": False}], "budget: too big")
    launch.refresh_from_db()
    assert launch.status == LaunchStatus.STOPPED and "pre-flight" not in launch.reason
    assert launch_state.transition(launch.pk, LaunchStatus.BLOCKED) is None
    assert Launch.objects.get(pk=launch.pk).status == LaunchStatus.STOPPED


def test_a_stop_during_pre_flight_wins_over_its_refusal():
    launch = _launch(LaunchStatus.PREFLIGHT)
    assert launch_state.transition(launch.pk, LaunchStatus.STOPPING) == LaunchStatus.PREFLIGHT
    launching._block(launch, [], "budget: too big")
    assert Launch.objects.get(pk=launch.pk).status == LaunchStatus.STOPPING


def test_a_transition_only_moves_a_row_that_matches_where():
    launch = _launch(LaunchStatus.STARTING)
    Launch.objects.filter(pk=launch.pk).update(worker_token="mine")
    moved = launch_state.transition(
        launch.pk, LaunchStatus.LOADING, where={"worker_token": "theirs"}
    )
    assert moved is None and Launch.objects.get(pk=launch.pk).status == LaunchStatus.STARTING


# --- no other status write ------------------------------------------------------------------

WRITERS = {"update", "create", "get_or_create", "update_or_create", "bulk_create", "bulk_update"}


def _status_writes(tree: ast.AST) -> list[int]:
    """Lines that write a launch's status other than through ``launch_state``: a queryset's
    ``update``/``create``… with ``status=`` on ``Launch``, ``<launch>.status = …``, a launch's
    ``save()`` that does not name its fields (it would write a status set in memory)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            chain = ast.unparse(node.func.value)
            keywords = {k.arg for k in node.keywords}
            if node.func.attr in WRITERS and "Launch." in f"{chain}." and "status" in keywords:
                found.append(node.lineno)
            if node.func.attr == "save" and "launch" in chain.lower():
                fields = next((k.value for k in node.keywords if k.arg == "update_fields"), None)
                if fields is None or "status" in ast.unparse(fields):
                    found.append(node.lineno)
        if isinstance(node, ast.Dict):  # fields gathered for an update(**fields)
            for key, value in zip(node.keys, node.values, strict=True):
                named = isinstance(key, ast.Constant) and key.value == "status"
                if named and "LaunchStatus" in ast.unparse(value):
                    found.append(node.lineno)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == "status"
                    and "launch" in ast.unparse(target.value).lower()
                ):
                    found.append(node.lineno)
    return found


def test_every_status_write_goes_through_the_transition_function():
    owner = ROOT / "nodes" / "services" / "launch_state.py"
    offenders = []
    for path in sorted((ROOT / "nodes").rglob("*.py")):
        if path == owner or "migrations" in path.parts:
            continue
        lines = _status_writes(ast.parse(path.read_text()))
        offenders += [f"{path.relative_to(ROOT)}:{line}" for line in lines]
    assert not offenders, "status written outside launch_state.transition: " + ", ".join(offenders)


@pytest.mark.parametrize(
    "source",
    [
        "Launch.objects.filter(pk=1).update(status=LaunchStatus.BLOCKED, ended=now)",
        "launch.status = LaunchStatus.BLOCKED",
        "launch.save()",
        "Launch.objects.filter(pk=1, status__in=running).update(status='failed')",
        'fields = {"status": LaunchStatus.READY, "ready_at": now}',
    ],
)
def test_the_walk_finds_the_writes_it_forbids(source):
    assert _status_writes(ast.parse(source)) == [1]
