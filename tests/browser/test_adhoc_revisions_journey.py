"""Journey (issue 19, item 5): a revision saved from an ad-hoc launch is not lost. The fix of
a failed ad-hoc command is saved as its @2; the launch links to the command's revisions, the
profile list shows the command, and @2 is saved as a named profile from there."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from nodes.models import LaunchProfile, ProfileRevision
from tests.browser.test_node_journey import log_in
from tests.factories import make_failed, make_node, make_user, pool_lines

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
GB = 10**9
ARGS = ["--model-path", "/m", "--tp-size", "8", "--enable-hierarchical-cache", "--hicache-size"]


def test_a_fix_of_an_ad_hoc_command_is_found_and_saved_as_a_named_profile(live_server, page):
    make_user("otto", "operator")
    node = make_node("gpu-01", sglang_version="0.5.9", mem_available_bytes=440 * GB)
    name = "ad-hoc 2026-12-02 07:00 otto"
    LaunchProfile.objects.create(name=name, created_by="otto", adhoc=True)
    failed = make_failed(node, [*ARGS, "300"], pool_lines(300), name=name)
    assert failed.adhoc and failed.diagnosis_category == "host-oom-hicache"

    log_in(page, live_server.url, "otto")
    page.goto(f"{live_server.url}/launches/{failed.pk}/")
    page.get_by_role("button", name="Apply as new revision").click()
    expect(page.locator(".messages")).to_contain_text(f"Fix from launch #{failed.pk}")
    fixed = ProfileRevision.objects.get(profile__name=name, number=2)

    # Left without launching it: the launch page leads to the command's revisions...
    page.goto(f"{live_server.url}/launches/{failed.pk}/")
    page.get_by_role("link", name=f"{name}@1").click()
    expect(page.locator("#revision-2")).to_contain_text(f"Fix from launch #{failed.pk}")
    expect(page.locator("#revision-1 .launched")).to_contain_text(f"#{failed.pk}")
    # ...and so does the profile list.
    page.get_by_role("link", name="Launch profiles").click()
    page.locator("#adhoc summary").click()
    page.locator("#adhoc").get_by_role("link", name=name).click()
    page.get_by_label("Profile name for @2").fill("kimi-fixed")
    page.locator("#revision-2").get_by_role("button", name="Save as profile").click()

    expect(page.get_by_role("heading", name="kimi-fixed")).to_be_visible()
    saved = ProfileRevision.objects.get(profile__name="kimi-fixed")
    assert saved.number == 1 and list(saved.args) == list(fixed.args)
    page.get_by_role("link", name="Launch profiles").click()
    expect(page.locator("table").first).to_contain_text("kimi-fixed")
