"""The fleet page: each node's GPUs and host RAM by owner (ours, committed, foreign, ghost) and
what its launches committed, from the database; another team's team-only launch unnamed."""

from __future__ import annotations

import pytest
from django.urls import reverse

from nodes.domain.units import GB, GiB
from nodes.models import Commitment, Gpu, Launch, LaunchProfile, ProfileRevision, Reservation, Team
from nodes.models.choices import LaunchStatus
from tests.factories import make_node, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    node = make_node("gpu-01", gpus=4, host_ram_bytes=449 * GB, mem_available_bytes=400 * GB)
    profile = LaunchProfile.objects.create(name="llama", created_by="pat")
    revision = ProfileRevision.objects.create(
        profile=profile, number=3, args=["--model-path", "/m"], env={}, author="pat",
        node=node, verdict="ok", report={},
    )  # fmt: skip
    launch = Launch.objects.create(
        revision=revision, node=node, gpus=[0, 1], port=30000, created_by="pat",
        startup_timeout_s=60, status=LaunchStatus.LOADING,
    )  # fmt: skip
    for i in (0, 1):
        Reservation.objects.create(node=node, kind="gpu", number=i, launch=launch)
    Commitment.objects.create(
        launch=launch, node=node, host_bytes=210 * GB, device_bytes={"0": 80 * GiB, "1": 80 * GiB}
    )
    gpus = {g.index: g for g in node.gpus.all()}
    ours = {"pid": 41, "name": "sglang::scheduler_TP0", "used_memory_bytes": 30 * GiB,
            "launch_id": launch.pk, "user": "root"}  # fmt: skip
    foreign = {"pid": 77, "name": "python3 train.py", "used_memory_bytes": 10 * GiB,
               "launch_id": None, "user": "bob"}  # fmt: skip
    Gpu.objects.filter(pk=gpus[0].pk).update(memory_used_bytes=30 * GiB, processes=[ours])
    Gpu.objects.filter(pk=gpus[2].pk).update(memory_used_bytes=10 * GiB, processes=[foreign])
    Gpu.objects.filter(pk=gpus[3].pk).update(memory_used_bytes=20 * GiB, processes=[])
    return {"node": node, "launch": launch, "profile": profile}


def test_the_fleet_page_shows_every_gpu_by_owner_and_the_host_ram_committed(viewer_client, world):
    page = viewer_client.get(reverse("nodes:fleet")).content.decode()
    launch = world["launch"]
    assert 'data-node="gpu-01"' in page and page.count('data-gpu="') == 4
    assert f"reserved by #{launch.pk} (llama@3)" in page
    assert "seg-ours" in page and "seg-committed" in page  # 30 GiB taken, 50 GiB to come
    assert "foreign PID 77 (bob) python3 train.py" in page
    assert "ghost 20 GiB" in page  # GPU 3: memory with no process
    assert "committed 210 GB" in page  # host RAM bar
    assert f"Committed here: #{launch.pk} (llama@3)" in page
    # The page polls itself; the fragment is the bars alone.
    part = viewer_client.get(reverse("nodes:fleet"), headers={"HX-Request": "true"})
    assert "<html" not in part.content.decode() and 'id="fleet-bars"' in part.content.decode()


def test_another_teams_team_only_launch_is_not_named(viewer_client, world):
    team = Team.objects.create(name="alpha")
    LaunchProfile.objects.filter(pk=world["profile"].pk).update(
        team=team, visibility=LaunchProfile.Visibility.TEAM
    )
    page = viewer_client.get(reverse("nodes:fleet")).content.decode()
    assert "llama@3" not in page and "reserved by a team-only launch" in page
    member = make_user("ann", "viewer")
    team.members.add(member.pk)
    viewer_client.force_login(member)
    assert "llama@3" in viewer_client.get(reverse("nodes:fleet")).content.decode()
