"""Known-good stamps on the simulated fleet: a launch healthy past the window stamps its
revision with what it really used; one that dies before does not; stamps stay where they were
earned; the profile list finds them by node and GPU class, newest success first."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from nodes.models import AuditEntry, KnownGoodStamp, Launch
from nodes.models.choices import LaunchStatus
from nodes.services.model_facts import model_facts
from nodes.services.profiles import evaluate, save_revision
from nodes.workflows import ending, launching
from tests.fleet import wait_until
from tests.launching import node_fixture, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
ARGS = ["--model-path", "/srv/models/qwen2.5-7b", "--tp-size", "2"]

spare = node_fixture("spare")
leaky = node_fixture("leaky")


@pytest.fixture
def olga(db):
    from tests.factories import make_user

    return make_user("olga", "operator")


def revision_on(node: Any, olga: Any) -> Any:
    model = model_facts(node, "/srv/models/qwen2.5-7b")
    return save_revision(
        profile_name="qwen-tp2",
        args=ARGS,
        env={},
        message="first",
        node=node,
        report=evaluate(ARGS, node, model),
        model=model,
        actor=olga,
    )


def test_a_launch_healthy_past_the_window_stamps_its_revision_with_what_it_used(
    spare, leaky, olga, launch_workers, client
):
    revision = revision_on(spare, olga)
    launch = launching.submit(node=spare, revision=revision, actor=olga)
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED) == "ready"
    stamp = wait_until(lambda: KnownGoodStamp.objects.filter(launch=launch).first(), 40)
    assert stamp, "no stamp after the known-good window"
    assert stamp.revision == revision and stamp.node == spare and stamp.gpu_count == 2
    assert stamp.gpu_class == "2 × NVIDIA H200 (80 GiB)"
    assert stamp.healthy_seconds >= 4 and stamp.launched_by == "olga"
    launch.refresh_from_db()
    assert stamp.observed["max_total_num_tokens"] == launch.server_info["max_total_num_tokens"]
    used = stamp.observed["gpu_used_bytes"]
    assert set(used) == {"0", "1"} and all(b > 10 * 2**30 for b in used.values())
    assert stamp.estimate == launch.estimate
    assert AuditEntry.objects.filter(action="profile.known_good").count() == 1
    ending.stop(launch.pk, actor=olga)

    # The same revision dying on another node before the window leaves the stamp alone.
    doomed = launching.submit(node=leaky, revision=revision, actor=olga)
    assert wait_for(doomed, LaunchStatus.READY, LaunchStatus.FAILED) == "ready"
    leaky.sim.ok("pkill -KILL -f '^sglang::scheduler_TP1'")
    assert wait_for(doomed, LaunchStatus.FAILED, timeout=60) == "failed"
    assert not KnownGoodStamp.objects.filter(launch=doomed).exists()
    assert KnownGoodStamp.objects.filter(revision=revision).count() == 1
    leaky.sim.reboot()

    client.force_login(olga)
    page = client.get(reverse("nodes:profile-list"), {"node": "spare"}).content.decode()
    assert "qwen-tp2" in page and "known-good" in page
    page = client.get(reverse("nodes:profile-list"), {"node": "leaky"}).content.decode()
    assert "No profile is known-good there yet." in page
    page = client.get(reverse("nodes:profile-list"), {"gpu_class": stamp.gpu_class}).content
    assert b"qwen-tp2" in page
    detail = client.get(reverse("nodes:profile-detail", args=[revision.profile_id])).content
    assert b"Observed" in detail and f"#{launch.pk}".encode() in detail
    # Figures read as figures: the observed token count with thousands separators.
    assert f"{stamp.observed['max_total_num_tokens']:,}".encode() in detail
    assert Launch.objects.get(pk=launch.pk).status == "stopped"
