"""Journey: an operator watches a launch that pre-flight then blocks; the page offers *Launch
again* with the failed check ticked, without a reload."""

from __future__ import annotations

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from nodes.models import Launch, LaunchProfile, ProfileRevision
from nodes.models.choices import LaunchStatus
from nodes.services.launch_state import transition
from tests.browser.test_node_journey import log_in
from tests.factories import make_node, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_launch_blocked_while_watched_offers_launch_again_without_a_reload(live_server, page):
    make_user("otto", "operator")
    node = make_node("gpu-01", sglang_version="0.5.9")
    profile = LaunchProfile.objects.create(name="qwen", created_by="otto")
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, args=["--model-path", "/m", "--tp-size", "2"], env={},
        author="otto", node=node, verdict="ok", report={},
    )  # fmt: skip
    launch = Launch.objects.create(
        revision=revision, node=node, gpus=[0, 1], port=30000, created_by="otto",
        startup_timeout_s=60, status=LaunchStatus.PENDING,
    )  # fmt: skip
    log_in(page, live_server.url, "otto")
    page.goto(f"{live_server.url}{reverse('nodes:launch-detail', args=[launch.pk])}")
    expect(page.locator("[data-status]")).to_have_text("Pending")
    expect(page.get_by_role("button", name="Launch again")).to_have_count(0)

    # Pre-flight (the worker) refuses it: the page follows by its own polling.
    failed = [{"name": "shm", "passed": False, "detail": "/dev/shm is 64 MiB", "override": ""}]
    transition(launch.pk, LaunchStatus.BLOCKED, reason="pre-flight: /dev/shm", checks=failed)
    expect(page.locator("[data-status]")).to_have_text("Blocked", timeout=15_000)
    expect(page.get_by_role("button", name="Launch again")).to_be_visible()
    expect(page.get_by_role("checkbox", name="shm")).to_be_checked()
