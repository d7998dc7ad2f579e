"""The launch page's test request: refused plainly where it cannot be sent, never leaking the
server's --api-key."""

from __future__ import annotations

import pytest
from django.urls import reverse

from nodes.models import Launch, LaunchProfile, ProfileRevision
from nodes.models.choices import LaunchStatus
from nodes.services import test_requests
from tests.factories import make_node

pytestmark = pytest.mark.django_db


def _launch(args: list[str], status: str = LaunchStatus.READY) -> Launch:
    node = make_node("gpu-01", sglang_version="0.5.9")
    profile = LaunchProfile.objects.create(name="qwen", created_by="pat")
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, args=args, env={}, author="pat", node=node, verdict="ok",
        report={},
    )  # fmt: skip
    return Launch.objects.create(
        revision=revision, node=node, gpus=[0], port=30000, created_by="pat",
        startup_timeout_s=60, status=status,
    )  # fmt: skip


def test_a_key_no_header_can_carry_is_said_without_the_key():
    launch = _launch(["--model-path", "/m", "--api-key", "sk-a\r\nX-Injected: 1"])
    answer = test_requests.send(launch)
    assert answer["kind"] == test_requests.KIND and "status" not in answer
    assert "cannot carry" in answer["error"] and "sk-a" not in str(answer)


def test_only_a_ready_launch_is_sent_one_and_only_operators_send(operator_client, viewer_client):
    launch = _launch(["--model-path", "/m"], status=LaunchStatus.FAILED)
    url = reverse("nodes:launch-test-request", args=[launch.pk])
    assert viewer_client.post(url).status_code == 403
    page = operator_client.post(url).content.decode()
    assert f"Test request not sent: launch #{launch.pk} is failed" in page
    # A poll with no reading, or another task's, is said so.
    assert "no test request was asked" in operator_client.get(url).content.decode()
