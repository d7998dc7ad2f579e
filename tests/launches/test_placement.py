"""Placement, from the database: where a revision fits now across the fleet (the budget beside
the launches committed on each node, who holds each GPU, quarantines), best first, and why it
does not fit elsewhere; as the CLI, the API and the launch form answer it."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse
from django.utils import timezone

from nodes.domain.units import GB, GiB
from nodes.models import (
    Commitment,
    Gpu,
    GpuQuarantine,
    Launch,
    LaunchProfile,
    ModelReading,
    Node,
    ProfileRevision,
    Reservation,
    Team,
)
from nodes.models.choices import LaunchStatus, NodeStatus
from nodes.services import placement, tokens
from tests.conftest import manage_py
from tests.factories import make_node, make_user

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake"
MODEL = "/srv/models/llama-3-70b"


def _node(name: str, gpus: int = 8, **fields) -> Node:
    fields.setdefault("mem_available_bytes", 430 * GB)
    fields.setdefault("status", NodeStatus.READY)
    node = make_node(name, gpus=gpus, host_key=KEY, **fields)
    # The model was looked for a moment ago: the budget goes on without its geometry, and no
    # read is queued.
    ModelReading.objects.create(
        node=node, model_path=MODEL, host=node.host, error="no model folder", read_at=timezone.now()
    )
    return node


def _revision(name: str, tp: int, hicache_gb: int, *, team: Team | None = None) -> ProfileRevision:
    visibility = LaunchProfile.Visibility.TEAM if team else LaunchProfile.Visibility.EVERYONE
    profile = LaunchProfile.objects.create(
        name=name, created_by="pat", team=team, visibility=visibility
    )
    args = ["--model-path", MODEL, "--tp-size", str(tp)]
    if hicache_gb:
        args += ["--enable-hierarchical-cache", "--hicache-size", str(hicache_gb)]
    return ProfileRevision.objects.create(
        profile=profile, number=1, args=args, env={}, author="pat", verdict="ok", report={}
    )


def _running(node: Node, revision: ProfileRevision, gpus: list[int], host_bytes: int) -> Launch:
    launch = Launch.objects.create(
        revision=revision, node=node, gpus=gpus, port=30000 + 10 * gpus[0], created_by="pat",
        startup_timeout_s=600, status=LaunchStatus.LOADING,
    )  # fmt: skip
    for i in gpus:
        Reservation.objects.create(node=node, kind="gpu", number=i, launch=launch)
    Commitment.objects.create(launch=launch, node=node, host_bytes=host_bytes)
    return launch


@pytest.mark.django_db
def test_candidates_come_best_first_and_each_other_node_says_why_not(olga):
    quiet, busy, small = _node("a-quiet"), _node("b-busy"), _node("c-small", gpus=2)
    _node("d-away", status=NodeStatus.MAINTENANCE)
    neighbour = _running(busy, _revision("other", 4, 75), [0, 1, 2, 3], 300 * GB)
    found = placement.place(_revision("llama", 4, 5), olga)
    # Both 8-GPU nodes fit: each GPU set of the one with no other launch first, then the busy
    # one's free GPUs.
    assert [(c.node, c.gpus) for c in found.candidates] == [
        ("a-quiet", [0, 1, 2, 3]),
        ("a-quiet", [4, 5, 6, 7]),
        ("b-busy", [4, 5, 6, 7]),
    ]
    # Host RAM left after it: MemAvailable less the other launch's unpinned 300 GB, less 20 GB.
    assert found.candidates[0].headroom_bytes == 430 * GB - 20 * GB
    assert found.candidates[2].headroom_bytes == 430 * GB - 300 * GB - 20 * GB
    assert f"GPU 0: reserved by launch #{neighbour.pk} (passed over)" in found.candidates[2].reasons
    refused = {r.node: r.reasons for r in found.refused}
    assert refused["c-small"][0] == "needs 4 GPU(s), 2 free of 2"
    assert refused["d-away"] == ["in maintenance"]
    assert quiet.name not in refused and small.name in refused


@pytest.mark.django_db
def test_a_node_where_it_fits_alone_but_not_beside_the_others_is_refused_naming_them(olga):
    node = _node("gpu-01", mem_available_bytes=440 * GB)
    other = _running(node, _revision("llama", 4, 105), [0, 1, 2, 3], 420 * GB)
    found = placement.place(_revision("second", 4, 105), olga)
    assert found.candidates == []
    (refusal,) = found.refused
    said = " ".join(refusal.reasons)
    assert f"#{other.pk} (llama@1)" in said and "420 GB" in said, said


@pytest.mark.django_db
def test_held_and_quarantined_gpus_are_passed_over_and_said_why(olga):
    node = _node("gpu-01")
    gpus = {g.index: g for g in node.gpus.all()}
    foreign = {"pid": 77, "name": "python3 train.py", "used_memory_bytes": 10 * GiB,
               "launch_id": None, "user": "bob"}  # fmt: skip
    Gpu.objects.filter(pk=gpus[2].pk).update(memory_used_bytes=10 * GiB, processes=[foreign])
    Gpu.objects.filter(pk=gpus[4].pk).update(memory_used_bytes=20 * GiB, processes=[])
    GpuQuarantine.objects.create(node=node, index=5, reason="memory held, no reset")
    (best,) = placement.place(_revision("llama", 4, 0), olga).candidates
    assert best.gpus == [0, 1, 3, 6]
    assert best.reasons[-3:] == [
        "GPU 2: held by a foreign process (PID 77, bob, python3 train.py, 10 GiB) (passed over)",
        "GPU 4: 20 GiB held by no process (passed over)",
        "GPU 5: quarantined (passed over)",
    ]


@pytest.mark.django_db
def test_another_teams_team_only_launch_is_not_named(olga):
    node = _node("gpu-01", gpus=4, mem_available_bytes=440 * GB)
    team = Team.objects.create(name="research")
    hidden = _running(node, _revision("secret", 2, 200, team=team), [0, 1], 400 * GB)
    viewer = make_user("vic", "viewer")
    refused = json.dumps(placement.place(_revision("big", 2, 105), viewer).to_json())
    assert f"beside launch #{hidden.pk} (a team-only launch) (400 GB)" in refused, refused
    (fits,) = placement.place(_revision("small", 2, 5), viewer).candidates
    assert "GPU 0: reserved by a team-only launch (passed over)" in fits.reasons, fits.reasons
    assert "secret" not in refused + json.dumps(fits.reasons)


@pytest.mark.django_db
def test_the_json_has_exactly_the_documented_keys(olga):
    _node("gpu-01")
    _node("gpu-02", gpus=1)
    doc = placement.place(_revision("llama", 2, 5), olga).to_json()
    assert set(doc) == {"revision", "candidates", "refused"} and doc["revision"] == "llama@1"
    # TP 2 on eight free GPUs: four GPU sets, each with the same keys.
    assert [c["gpus"] for c in doc["candidates"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [set(c) for c in doc["candidates"]] == [
        {"node", "gpus", "verdict", "headroom_bytes", "reasons"}
    ] * 4
    assert [set(r) for r in doc["refused"]] == [{"node", "reasons"}]
    assert json.loads(json.dumps(doc)) == doc


@pytest.mark.django_db
def test_the_launch_form_preselects_the_best_node_and_gpus(client, olga):
    _node("a-busy")
    best = _node("b-free")
    _running(Node.objects.get(name="a-busy"), _revision("x", 1, 1), [0], GB)
    revision = _revision("llama", 4, 5)
    client.force_login(olga)
    page = client.get(
        reverse("nodes:launch-create"), {"profile": "llama", "revision": revision.number}
    ).content.decode()
    assert "Where llama@1 fits now" in page
    assert f'<option value="{best.pk}" selected>' in page
    assert 'value="0,1,2,3"' in page


@pytest.mark.django_db
def test_the_node_a_link_chose_stays_where_it_fits_and_is_replaced_where_not(client, olga):
    """*Launch @N* on a profile's page names the revision's node: kept, with free GPUs, where
    the revision fits there; where it does not, the best node instead, and the page says so."""
    busy, free = _node("a-busy", gpus=4), _node("b-free")
    _running(busy, _revision("x", 1, 1), [0], GB)
    _revision("llama", 2, 5)
    client.force_login(olga)
    url = reverse("nodes:launch-create")
    kept = client.get(url, {"profile": "llama", "revision": 1, "node": busy.pk}).content.decode()
    assert f'<option value="{busy.pk}" selected>' in kept and 'value="1,2"' in kept
    assert "does not fit on" not in kept
    _revision("big", 4, 5)
    moved = client.get(url, {"profile": "big", "revision": 1, "node": busy.pk}).content.decode()
    assert f'<option value="{free.pk}" selected>' in moved and 'value="0,1,2,3"' in moved
    assert "It does not fit on a-busy, the node the link chose, now" in moved
    assert "the form starts with b-free instead" in moved


@pytest.mark.django_db(transaction=True)
def test_the_cli_answers_json_and_exits_0_1_or_2(settings):
    make_user("olga", "operator")
    _node("gpu-01")
    _revision("fits", 4, 5)
    _revision("too-big", 8, 300)
    env = {"RANKWISE_ACTOR": "olga"}
    fits = manage_py(settings, "place", "fits", "--json", env=env)
    assert fits.returncode == 0, fits.stderr
    doc = json.loads(fits.stdout)
    assert doc["revision"] == "fits@1" and doc["candidates"][0]["gpus"] == [0, 1, 2, 3]
    nowhere = manage_py(settings, "place", "too-big@1", env=env)
    assert nowhere.returncode == 1 and "fits nowhere now" in nowhere.stdout
    assert "gpu-01" in nowhere.stdout and "2400 GB" in nowhere.stdout, nowhere.stdout
    for bad in ("nothing", "fits@2", "fits@x"):
        result = manage_py(settings, "place", bad, env=env)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.django_db(transaction=True)
def test_the_api_answers_as_the_cli(client):
    _node("gpu-01")
    _revision("fits", 4, 5)
    user = make_user("vic", "viewer")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(user, 'test')}"}
    doc = client.get("/api/profiles/fits/placement", **headers).json()
    assert doc["revision"] == "fits@1" and doc["candidates"][0]["node"] == "gpu-01"
    assert client.get("/api/profiles/fits/placement?revision=1", **headers).status_code == 200
    for missing in ("/api/profiles/fits/placement?revision=2", "/api/profiles/nope/placement"):
        assert client.get(missing, **headers).status_code == 404
    negative = client.get("/api/profiles/fits/placement?revision=-1", **headers)
    assert negative.status_code == 422
    assert "revision number (1 or more)" in negative.json()["detail"]


@pytest.mark.django_db
def test_a_multi_node_revision_is_placed_on_groups_of_nodes_with_the_same_gpus_free(client, olga):
    """Found by a newcomer: a --nnodes 2 revision was "placed" on one node, as if it fitted."""
    a, b = _node("a-one", gpus=4), _node("b-two", gpus=4)
    _node("c-three", gpus=4)
    _running(b, _revision("other", 2, 5), [0, 1], 10 * GB)
    revision = _revision("kimi", 4, 5)
    revision.args = [*revision.args, "--nnodes", "2"]
    revision.save(update_fields=["args"])
    found = placement.place(revision, olga)
    # TP 4 over 2 nodes: 2 GPUs on each, the same ones on both.
    assert [(c.node, c.gpus) for c in found.candidates] == [
        ("a-one,c-three", [0, 1]),
        ("a-one,c-three", [2, 3]),
        ("a-one,b-two", [2, 3]),
        ("b-two,c-three", [2, 3]),
    ]
    assert all("," in c.node for c in found.candidates)
    # The launch form starts with the best group: node 0 and the other node filled in.
    client.force_login(olga)
    page = client.get(reverse("nodes:launch-create"), {"profile": "kimi", "revision": 1})
    body = page.content.decode()
    assert f'<option value="{a.pk}" selected>' in body and 'value="c-three"' in body
    # Three nodes for --nnodes 4: no group, and each node says why.
    revision.args = [*revision.args[:-2], "--nnodes", "4"]
    revision.save(update_fields=["args"])
    found = placement.place(revision, olga)
    assert found.candidates == []
    assert any(
        "--nnodes 4 needs 4 nodes" in r for refusal in found.refused for r in refusal.reasons
    )
