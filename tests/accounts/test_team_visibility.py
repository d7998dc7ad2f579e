"""A team-only profile's launches exist only for its team (and admins): everyone else gets 404
on every page, stream, download and API answer about them, finds them in no list, audit entry
or node page (which says only that GPUs are taken by "a team-only launch"), and cannot write a
revision into the profile by any door."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import AsyncClient, Client
from django.urls import reverse

from nodes.models import (
    AuditEntry,
    Cleanup,
    Launch,
    LaunchProfile,
    NodeEvent,
    ProfileRevision,
    Reservation,
    Team,
)
from nodes.services import model_facts, profiles, tokens
from nodes.services.audit import record
from tests.factories import make_failed, make_node, make_user, pool_lines
from tests.sse import in_fresh_loop, read_stream

pytestmark = pytest.mark.django_db(transaction=True)
INCIDENT = ["--model-path", "/m", "--tp-size", "8", "--enable-hierarchical-cache"]
GB = 10**9


@pytest.fixture
def world() -> dict[str, Any]:
    """The issue's sequence: op1 (team alpha) makes ``alpha-secret`` team-only on its page and
    its launch fails, keeping GPUs 0 and 1; op2 is in team beta; a viewer is in no team."""
    alpha, beta = Team.objects.create(name="alpha"), Team.objects.create(name="beta")
    op1, op2 = make_user("op1", "operator"), make_user("op2", "operator")
    alpha.members.add(op1.pk)
    beta.members.add(op2.pk)
    node = make_node("gpu-01", sglang_version="0.5.9", mem_available_bytes=440 * GB)
    profile = LaunchProfile.objects.create(name="alpha-secret", created_by="op1")
    _client(op1).post(
        reverse("nodes:profile-ownership", args=[profile.pk]),
        {"team": alpha.pk, "visibility": "team"},
    )
    launch = make_failed(
        node, [*INCIDENT, "--hicache-size", "300"], pool_lines(300), name="alpha-secret"
    )
    assert launch.diagnosis_category == "host-oom-hicache"
    record("launch.create", actor=op1, obj=launch, after=launch.summary())
    for gpu in (0, 1):
        Reservation.objects.create(node=node, kind="gpu", number=gpu, launch=launch)
    job = Cleanup.objects.create(
        node=node, launch=launch, gpus=[2], requested_by="op1", status=Cleanup.Status.DONE
    )
    record(
        "node.cleanup", actor=None, actor_name="op1", obj=node,
        after={"cleanup": job.pk, "launch": launch.pk, "gpus": [2]},
    )  # fmt: skip
    NodeEvent.objects.create(
        node=node, kind="reservation", message=f"GPU 2 released from ended launch #{launch.pk}"
    )
    return {
        "op1": op1,
        "op2": op2,
        "viewer": make_user("vic", "viewer"),
        "admin": make_user("ada", "admin"),
        "node": node,
        "launch": launch,
        "cleanup": job,
    }


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _bearer(user: Any) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(user, 'test')}"}


def _stream_status(user: Any, launch: Launch) -> int:
    async def fetch() -> int:
        client = AsyncClient()
        await client.aforce_login(user)
        response = await client.get(reverse("nodes:launch-events", args=[launch.pk]))
        if response.status_code == 200:
            await read_stream(response)
        return int(response.status_code)

    return int(in_fresh_loop(fetch()))


@pytest.mark.parametrize("who", ["op2", "viewer"])
def test_outsiders_get_404_for_a_team_only_launch_and_find_it_nowhere(world, who):
    launch, node = world["launch"], world["node"]
    client, token = _client(world[who]), _bearer(world[who])
    for name in ("launch-detail", "launch-lines", "launch-log", "launch-bundle"):
        url = reverse(f"nodes:{name}", args=[launch.pk])
        assert client.get(url).status_code == 404, name
    state = client.get(
        reverse("nodes:launch-detail", args=[launch.pk]), {"part": "state"}, HTTP_HX_REQUEST="true"
    )
    assert state.status_code == 404
    assert _stream_status(world[who], launch) == 404
    assert (
        client.get(reverse("nodes:cleanup-detail", args=[world["cleanup"].pk])).status_code == 404
    )
    url = f"/launches/{launch.pk}/"
    listed = client.get(reverse("nodes:launch-list")).content.decode()
    assert url not in listed and "alpha-secret" not in listed and "host-oom-hicache" not in listed
    page = client.get(reverse("nodes:node-detail", args=[node.pk])).content.decode()
    assert url not in page and "alpha-secret" not in page
    assert f"launch #{launch.pk}" not in page and "op1" not in page
    assert "GPU 0,1: taken by a team-only launch" in page
    assert "GPU 2 released from ended a team-only launch" in page
    audit = client.get(reverse("nodes:audit-list")).content.decode()
    assert "alpha-secret" not in audit and f"launch #{launch.pk}" not in audit
    assert f'"launch": {launch.pk}' not in audit
    # The API: not listed, and 404 wherever it is named.
    items = client.get("/api/launches", **token).json()["items"]
    assert launch.pk not in [i["id"] for i in items]
    for path in (f"/api/launches/{launch.pk}", f"/api/launches/{launch.pk}/log"):
        assert client.get(path, **token).status_code == 404, path
    assert client.get(f"/api/cleanups/{world['cleanup'].pk}", **token).status_code == 404
    # A node-wide cleanup found the launch's process holding GPU 0: it says only whose it is.
    held = {"pid": 4242, "command": "python3 -m sglang.launch_server", "launch_id": launch.pk}
    wide = Cleanup.objects.create(
        node=node, gpus=[0], requested_by="op1", status=Cleanup.Status.DONE,
        result={"gpus": [{"index": 0, "state": "held", "holders": [held]}], "host": {}},
    )  # fmt: skip
    holders = client.get(f"/api/cleanups/{wide.pk}", **token).json()["gpus"][0]["holders"]
    assert holders == [{"pid": 4242, "command": "", "launch_id": None, "team_only": True}]
    if who == "op2":
        stop = client.post(f"/api/launches/{launch.pk}/stop", **token)
        assert stop.status_code == 404
        assert client.post(reverse("nodes:launch-stop", args=[launch.pk])).status_code == 404
        cleanup = client.get(reverse("nodes:node-cleanup", args=[node.pk]), {"launch": launch.pk})
        assert cleanup.status_code == 404
        assert not AuditEntry.objects.filter(action="launch.stop").exists()


@pytest.mark.parametrize("who", ["op1", "admin"])
def test_the_team_and_admins_still_see_the_launch_everywhere(world, who):
    launch, node = world["launch"], world["node"]
    client, token = _client(world[who]), _bearer(world[who])
    assert client.get(reverse("nodes:launch-detail", args=[launch.pk])).status_code == 200
    assert client.get(reverse("nodes:launch-log", args=[launch.pk])).status_code == 200
    assert _stream_status(world[who], launch) == 200
    assert f"/launches/{launch.pk}/" in client.get(reverse("nodes:launch-list")).content.decode()
    page = client.get(reverse("nodes:node-detail", args=[node.pk])).content.decode()
    assert f"/launches/{launch.pk}/" in page and "taken by a team-only launch" not in page
    assert "alpha-secret" in client.get(reverse("nodes:audit-list")).content.decode()
    assert client.get(f"/api/launches/{launch.pk}/log", **token).status_code == 200
    items = client.get("/api/launches", **token).json()["items"]
    assert [i["id"] for i in items] == [launch.pk]


def test_an_outsider_cannot_write_a_revision_into_a_team_only_profile(world):
    launch, op2 = world["launch"], world["op2"]
    revisions = ProfileRevision.objects.count()
    # The sequence: op2 applies the failed launch's fix (a 302 and alpha-secret@2 before).
    response = _client(op2).post(reverse("nodes:launch-apply-fix", args=[launch.pk]))
    assert response.status_code == 404
    # The API's save and the service every door goes through refuse it the same way.
    saved = _client(op2).post(
        "/api/profiles/alpha-secret/revisions",
        {"node": "gpu-01", "args": [*INCIDENT, "--hicache-size", "37"]},
        content_type="application/json", **_bearer(op2),
    )  # fmt: skip
    assert saved.status_code == 404
    report = profiles.evaluate([*INCIDENT, "--hicache-size", "37"], world["node"], _no_model())
    with pytest.raises(profiles.ProfileHidden):
        profiles.save_revision(
            profile_name="alpha-secret", args=[*INCIDENT, "--hicache-size", "37"], env={},
            message="", node=world["node"], report=report, model=_no_model(), actor=op2,
        )  # fmt: skip
    assert ProfileRevision.objects.count() == revisions
    assert not AuditEntry.objects.filter(action="profile.revision", actor=op2).exists()
    # Its own team still can.
    fixed = _client(world["op1"]).post(reverse("nodes:launch-apply-fix", args=[launch.pk]))
    assert fixed.status_code == 302
    assert ProfileRevision.objects.get(profile__name="alpha-secret", number=2).author == "op1"


def _no_model() -> model_facts.ModelFacts:
    return model_facts.ModelFacts(None, None, "not read")


def test_a_launch_refused_for_gpus_a_team_only_launch_holds_does_not_name_it(world):
    node, hidden = world["node"], world["launch"]
    node.host_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake"
    node.save()
    open_profile = LaunchProfile.objects.create(name="beta-open", created_by="op2")
    revision = ProfileRevision.objects.create(
        profile=open_profile, number=1, args=["--model-path", "/m", "--tp-size", "2"], env={},
        author="op2", node=node, verdict="ok", report={"lines": [], "messages": []},
    )  # fmt: skip
    _client(world["op2"]).post(
        reverse("nodes:launch-create"), {"revision": revision.pk, "node": node.pk, "gpus": "0,1"}
    )
    refused = Launch.objects.get(revision=revision)
    assert "GPU 0 by a team-only launch" in refused.reason
    assert f"#{hidden.pk}" not in refused.reason and "alpha-secret" not in refused.reason


def test_gpu_holders_of_a_team_only_launch_say_only_that(world):
    from nodes.domain.gpu_holders import Holder
    from nodes.services import teams

    def read_by(user: Any) -> list[dict[str, Any]]:
        found = [
            Holder(41, command="sglang::scheduler_TP0 --api-key x", launch_id=world["launch"].pk),
            Holder(77, command="python train.py"),
        ]
        teams.mask_holders(user, found)
        return [h.to_json() for h in found]

    outsider = read_by(world["op2"])
    assert outsider[0] == {
        "pid": 41, "ppid": None, "state": "?", "command": "", "launch_id": None, "team_only": True,
    }  # fmt: skip
    assert outsider[1]["command"] == "python train.py"
    member = read_by(world["op1"])
    assert member[0]["launch_id"] == world["launch"].pk and not member[0]["team_only"]


def test_a_team_only_launchs_calibration_does_not_name_it(world):
    """Figures a team-only launch logged still calibrate everyone's estimates, but the text
    anyone reads (budget lines, the profile page) says "a team-only launch", not its number."""
    from nodes.models import Calibration
    from nodes.services import calibrations

    launch = world["launch"]
    found = Calibration.objects.create(
        model_path="/srv/models/kimi-k2", gpu_name="NVIDIA H200", tp_size=8,
        node=launch.node, node_name=launch.node.name, launch=launch,
        source=f"launch #{launch.pk} on {launch.node.name}",
        free_before_load_bytes=90 * 2**30, weights_per_rank_bytes=72 * 2**30,
    )  # fmt: skip
    said = calibrations.label(found)
    assert f"#{launch.pk}" not in said and "a team-only launch on gpu-01" in said, said
    LaunchProfile.objects.filter(name="alpha-secret").update(visibility="everyone")
    assert f"launch #{launch.pk} on gpu-01" in calibrations.label(found)
