"""Journey: from a profile's page an operator launches it, watches the log arrive live (no
reload), sees the server become ready, and stops it. Served by the real ASGI panel."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from nodes.services.model_facts import model_facts
from nodes.services.profiles import evaluate, save_revision
from nodes.workflows import discovery
from tests.browser.test_node_journey import log_in
from tests.conftest import register_sim_node
from tests.factories import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
ARGS = ["--model-path", "/srv/models/llama-3-70b", "--tp-size", "2", "--enable-metrics"]


def test_launch_from_the_profile_page_watch_the_log_see_ready_stop(
    panel, page, sim_fleet, launch_workers
):
    sim = sim_fleet["spare"]
    sim.make_clean()
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    node.refresh_from_db()
    olga = make_user("olga", "operator")
    model = model_facts(node, "/srv/models/llama-3-70b")
    revision = save_revision(
        profile_name="llama-70b-tp2",
        args=ARGS,
        env={},
        message="first",
        node=node,
        report=evaluate(ARGS, node, model),
        model=model,
        actor=olga,
    )

    log_in(page, panel.url, "olga")
    page.get_by_role("link", name="Launch profiles").click()
    page.get_by_role("link", name="llama-70b-tp2").click()
    page.get_by_role("link", name="Launch @1").click()
    expect(page.get_by_label("Profile revision")).to_have_value(str(revision.pk))
    page.get_by_role("button", name="Launch").click()

    expect(page.get_by_role("heading", name="Launch #")).to_be_visible()
    url = page.url
    log = page.locator("#launch-log span")
    expect(log.first).to_be_visible(timeout=30_000)  # lines arrive without a reload
    expect(page.locator("#launch-log")).to_contain_text("Load weight begin", timeout=30_000)
    expect(page.locator("[data-status]")).to_have_text("Ready", timeout=60_000)
    expect(page.locator("#launch-log")).to_contain_text("The server is fired up and ready to roll!")
    expect(page.locator(".checks")).to_contain_text("gpus_idle")
    expect(page.locator("#launch-state")).to_contain_text("generation throughput")
    assert page.url == url

    # Stop asks first, naming the server and who started it; dismissed, nothing stops.
    asked: list[str] = []

    def dismiss(dialog) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("[data-status]")).to_have_text("Ready")
    assert asked and "Stop the server of launch #" in asked[0] and "Started by" in asked[0]
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("[data-status]")).to_have_text("Stopped", timeout=60_000)
    # The "Stopping…" banner goes once the launch has stopped.
    expect(page.get_by_text(re.compile(r"Stopping launch #\d+"))).to_have_count(0, timeout=30_000)
    expect(page.locator("#launch-log")).to_contain_text("Shutting down", timeout=30_000)
    expect(page.locator("#log-status")).to_have_text("Log complete.", timeout=30_000)
