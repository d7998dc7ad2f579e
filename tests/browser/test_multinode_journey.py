"""Journey (issue 22): an operator launches Kimi-K2 over two nodes from the launch form, watches
both nodes' lines arrive in one log, each tagged with its node, sees every node's part ready,
and stops the lot. Served by the real ASGI panel."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from nodes.models import Launch
from tests import launching as shared
from tests.browser.test_node_journey import log_in
from tests.fleet import wait_until
from tests.launching import sglang_processes, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
pair_fleet, pair = shared.pair_fleet, shared.pair  # two 8-GPU nodes, "pa" and "pb"
COMMAND = "python3 -m sglang.launch_server --model-path /srv/models/kimi-k2 --tp 16 --nnodes 2"


def test_a_two_node_launch_from_the_form_one_log_tagged_by_node_then_stop(
    panel, page, pair, launch_workers
):
    a, b = pair
    log_in(page, panel.url, "olga")
    page.goto(f"{panel.url}/launches/new/")
    page.locator("#id_command").fill(COMMAND)
    page.locator("#id_node").select_option(label="pa")
    page.locator("#id_other_nodes").fill("pb")
    page.get_by_role("button", name="Launch").click()

    expect(page.get_by_role("heading", name="Launch #")).to_be_visible()
    nodes = page.locator("table.group-nodes")
    expect(nodes).to_contain_text("pa")
    expect(nodes).to_contain_text("pb")
    # Both nodes' lines arrive live, in one log, each with its node's tag.
    log = page.locator("#launch-log")
    expect(log.locator(".node-tag", has_text="pb").first).to_be_visible(timeout=60_000)
    expect(log.locator(".node-tag", has_text="pa").first).to_be_visible(timeout=60_000)
    # The launch's own record says why, should it fail instead (a start-up under load).
    launch = Launch.objects.order_by("-pk").filter(group__isnull=True).first()
    assert launch is not None
    ended = wait_for(launch, "ready", "failed", "error", "blocked", timeout=180)
    assert ended == "ready", list(Launch.objects.values("node__name", "status", "reason"))
    expect(page.locator("[data-status]")).to_have_text("Ready", timeout=30_000)
    expect(nodes.locator("tr[data-node=pb]")).to_contain_text("ready", timeout=30_000)
    expect(log).to_contain_text("The server is fired up and ready to roll!")
    expect(page.locator(".checks")).to_contain_text("dist_init")

    # The node filter shows one node's lines only.
    page.locator("#log-node").select_option("pb")
    expect(log.locator(".node-tag", has_text="pa")).to_have_count(0, timeout=15_000)
    expect(log.locator(".node-tag", has_text="pb").first).to_be_visible()
    page.locator("#log-node").select_option("")

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("[data-status]")).to_have_text("Stopped", timeout=90_000)
    expect(nodes.locator("tr[data-node=pb]")).to_contain_text("stopped", timeout=30_000)
    assert wait_until(lambda: sglang_processes(a.sim) == [] and sglang_processes(b.sim) == [], 30)
