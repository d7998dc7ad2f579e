"""A revision is judged against its node as inventoried (empty GPUs; what the panel's launches
pinned counted back), not against whatever runs there now; "could it start now" is the separate
answer that says what holds the GPUs (issue 33, item 3). A relaunch's own check (capacity,
fixes) sees the node as the profile's own launch would find it (issue 19, item 2)."""

from __future__ import annotations

import pytest

from nodes.domain.units import GB, GiB
from nodes.models import Commitment, Gpu, Launch, LaunchProfile, ProfileRevision
from nodes.models.choices import LaunchStatus
from nodes.services.model_facts import ModelFacts
from nodes.services.profiles import (
    ProfileExists,
    evaluate,
    node_as_inventoried,
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

    def check(name: str) -> str:
        data = profile_form_data(node, name=name, hicache_size="150", tp_size="2")
        body: str = client.post(reverse("nodes:profile-check"), data).content.decode()
        return body.replace(name, "NAME")

    # Naming the hidden profile answers exactly as naming a new one does.
    hidden = check("alpha-secret")
    assert "own launches" not in hidden and hidden == check("brand-new")


def test_a_revision_is_judged_against_the_node_as_inventoried_not_what_runs_now(client):
    """Found by a newcomer: while an ad-hoc launch held the GPUs, saving a known-good profile
    unchanged was blocked ("the weights fill the static pool … use more GPUs"), and other
    revisions kept verdicts computed against busy GPUs."""
    from django.urls import reverse

    from tests.factories import profile_form_data

    node = make_node(
        "gpu-01", gpus=2, mem_available_bytes=40 * GB, sglang_version="0.5.9",
        host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake",
    )  # fmt: skip
    launch = _running(node, "ad-hoc 20261204-212730-751d6a", adhoc=True)
    empty = node_as_inventoried(node)
    assert empty.gpu_used_bytes == (0, 0) and empty.mem_available_bytes == 440 * GB
    client.force_login(make_user("otto", "operator"))
    data = profile_form_data(node, name="llama", hicache_size="150", tp_size="2")
    body = client.post(reverse("nodes:profile-check"), data).content.decode()
    # The verdict: against empty GPUs and the RAM the panel's launches give back.
    assert "400 GB pinned by the panel&#x27;s launches there" in body
    assert "90 GiB used" not in body and "verdict-block" not in body, body
    # Could it start now? No, and it says what holds the GPUs.
    now = body[body.index("Could it start on gpu-01 now") :]
    assert "Not now (saving is not refused for this)" in now
    assert f"#{launch.pk}" in now and "GPU 0" in now, now


def test_a_model_folder_the_node_does_not_have_is_a_block_at_save_and_not_now(client):
    """Found by a newcomer: a typo'd model path saved as a green ``ok`` and "Could it start
    now? Yes"; only a grey subtitle said the folder was missing, and the launch then failed."""
    from django.urls import reverse
    from django.utils import timezone

    from nodes.models import ModelReading
    from nodes.services.model_facts import PROBE_PROBLEMS, model_facts
    from tests.factories import profile_form_data

    node = make_node(
        "gpu-01", gpus=2, mem_available_bytes=400 * GB, sglang_version="0.5.9",
        host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake", status="ready",
    )  # fmt: skip
    data = profile_form_data(node, name="llama", hicache_size="10", tp_size="2")
    typo = data["model_path"]
    # What the agent's "no-folder" answer is stored as, a moment ago (no read is queued).
    words = PROBE_PROBLEMS["no-folder"].format(path=typo, node=node.name)
    ModelReading.objects.create(
        node=node, model_path=typo, host=node.host, error=words, read_at=timezone.now()
    )
    model = model_facts(node, typo, wait=0)
    assert model.missing == words
    report = evaluate(["--model-path", typo, "--tp-size", "2"], node, model)
    assert report.verdict == "block"
    assert any(m.code == "model-missing" for m in report.messages)
    with pytest.raises(ValueError, match="a blocked profile cannot be saved"):
        save_revision(
            profile_name="llama", args=["--model-path", typo, "--tp-size", "2"], env={},
            message="", node=node, report=report, model=model, actor=make_user("ann", "operator"),
        )  # fmt: skip
    assert not ProfileRevision.objects.filter(profile__name="llama").exists()

    client.force_login(make_user("otto", "operator"))
    body = client.post(reverse("nodes:profile-check"), data).content.decode()
    assert f"No model folder at {typo} on gpu-01: SGLang cannot start from it" in body
    now = body[body.index("Could it start on gpu-01 now") :]
    assert "Not now either" in now and "Yes:" not in now
