"""A revision is checked against its node as the profile's own launch would find it: what its
running launches hold there is theirs, not "used by others" (issue 19, item 2)."""

from __future__ import annotations

import pytest

from nodes.domain.units import GB, GiB
from nodes.models import Commitment, Gpu, Launch, LaunchProfile, ProfileRevision
from nodes.models.choices import LaunchStatus
from nodes.services.model_facts import ModelFacts
from nodes.services.profiles import (
    ProfileExists,
    evaluate,
    node_memory_for,
    promote,
    save_revision,
)
from tests.factories import make_node, make_user

pytestmark = pytest.mark.django_db
ARGS = ["--model-path", "/m", "--tp-size", "2", "--enable-hierarchical-cache", "--hicache-size"]


def _running(node, name: str, *, adhoc: bool = False) -> Launch:
    """A ready launch of profile ``name`` holding GPUs 0 and 1 (90 GiB each) and 400 GB of
    pinned host pools; MemAvailable shows them taken."""
    profile = LaunchProfile.objects.create(name=name, created_by="pat", adhoc=adhoc)
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, args=[*ARGS, "200"], env={}, author="pat", node=node,
        verdict="ok", report={},
    )  # fmt: skip
    launch = Launch.objects.create(
        revision=revision, node=node, gpus=[0, 1], port=30000, created_by="pat",
        startup_timeout_s=60, status=LaunchStatus.READY,
    )  # fmt: skip
    Commitment.objects.create(launch=launch, node=node, host_bytes=400 * GB, pinned=True)
    for index in (0, 1):
        held = {"pid": 40 + index, "name": f"sglang::scheduler_TP{index}", "launch_id": launch.pk,
                "used_memory_bytes": 90 * GiB}  # fmt: skip
        Gpu.objects.filter(node=node, index=index).update(
            memory_used_bytes=90 * GiB, processes=[held]
        )
    return launch


def test_the_profiles_own_launch_counts_free_and_anyone_elses_stays_used():
    node = make_node("gpu-01", gpus=2, mem_available_bytes=40 * GB, sglang_version="0.5.9")
    _running(node, "llama")
    own = node_memory_for(node, "llama", viewer=None)
    assert own.gpu_used_bytes == (0, 0)
    assert own.mem_available_bytes == 440 * GB  # 40 GB available + the 400 GB it pinned
    assert own.own_pinned_bytes == 400 * GB
    for other in ("qwen", None):
        theirs = node_memory_for(node, other, viewer=None)
        assert theirs.gpu_used_bytes == (90 * GiB, 90 * GiB)
        assert theirs.mem_available_bytes == 40 * GB


def test_a_new_revision_beside_its_own_server_is_not_blocked_by_it():
    node = make_node("gpu-01", gpus=2, mem_available_bytes=40 * GB, sglang_version="0.5.9")
    _running(node, "llama")
    model = ModelFacts(None, None, "not read")
    args = [*ARGS, "150"]
    assert evaluate(args, node, model).verdict == "block"  # counting its own 400 GB as used
    memory = node_memory_for(node, "llama", viewer=None)
    report = evaluate(args, node, model, memory=memory)
    assert report.verdict != "block"
    # The arithmetic says where the memory it counts comes from.
    assert any(
        "MemAvailable now 40 GB + 400 GB pinned by this profile's own launches" in line
        for line in report.lines
    ), report.lines


def test_an_ad_hoc_revision_is_promoted_beside_its_own_server(settings):
    settings.RANKWISE_MODEL_READ_WAIT_SECONDS = 0
    node = make_node("gpu-01", gpus=2, mem_available_bytes=40 * GB, sglang_version="0.5.9")
    launch = _running(node, "ad-hoc 1a2b", adhoc=True)
    saved = promote(launch.revision, "llama-hicache", actor=make_user("otto", "operator"))
    assert saved.profile.name == "llama-hicache" and saved.verdict != "block"


def test_a_profile_that_must_be_new_is_not_added_to_one_made_meanwhile():
    node = make_node("gpu-01", gpus=2, sglang_version="0.5.9")
    otto = make_user("otto", "operator")
    LaunchProfile.objects.create(name="taken", created_by="pat")
    model = ModelFacts(None, None, "not read")
    report = evaluate([*ARGS, "10"], node, model)
    with pytest.raises(ProfileExists):
        save_revision(
            profile_name="taken", args=[*ARGS, "10"], env={}, message="", node=node,
            report=report, model=model, actor=otto, new_profile=True,
        )  # fmt: skip
    assert not ProfileRevision.objects.filter(profile__name="taken").exists()


def test_another_teams_hidden_profile_named_in_the_check_tells_nothing(client):
    """An outsider naming a team-only profile in the check gets the node as for a new profile:
    its running launch's memory stays used, and no line speaks of "this profile's own"."""
    from django.urls import reverse

    from nodes.models import Team
    from tests.factories import profile_form_data

    node = make_node("gpu-01", gpus=2, mem_available_bytes=40 * GB, sglang_version="0.5.9")
    launch = _running(node, "alpha-secret")
    alpha, beta = Team.objects.create(name="alpha"), Team.objects.create(name="beta")
    LaunchProfile.objects.filter(pk=launch.revision.profile_id).update(
        team=alpha, visibility=LaunchProfile.Visibility.TEAM
    )
    insider, outsider = make_user("ann", "operator"), make_user("bob", "operator")
    alpha.members.add(insider.pk)
    beta.members.add(outsider.pk)
    assert node_memory_for(node, "alpha-secret", viewer=insider).own_pinned_bytes == 400 * GB
    assert node_memory_for(node, "alpha-secret", viewer=outsider) == node_memory_for(
        node, None, viewer=outsider
    )
    client.force_login(outsider)
    data = profile_form_data(node, name="alpha-secret", hicache_size="150", tp_size="2")
    body = client.post(reverse("nodes:profile-check"), data).content.decode()
    assert "own launches" not in body and "400 GB pinned" not in body
