"""Journey (issue 20, item 1): a server started with --enable-metrics gets load plots on its
launch page that grow without a reload, and a stopped launch keeps them."""

from __future__ import annotations

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from nodes.workflows import launching
from tests.browser.test_node_journey import log_in
from tests.browser.test_reuse_journey import ready_node
from tests.factories import make_user
from tests.launching import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
COMMAND = (
    "python3 -m sglang.launch_server --model-path /srv/models/qwen2.5-7b --tp-size 2 "
    "--enable-metrics"
)


def test_load_points_arrive_without_a_reload_and_stay_after_the_stop(
    panel, page, sim_fleet, launch_workers
):
    node = ready_node(sim_fleet["spare"])
    olga = make_user("olga", "operator")
    launch = launching.submit(node=node, command=COMMAND, actor=olga)
    assert wait_for(launch, "ready", "failed", "blocked", timeout=120) == "ready"
    log_in(page, panel.url, "olga")
    page.goto(f"{panel.url}{reverse('nodes:launch-detail', args=[launch.pk])}")
    url = page.url
    requests = page.locator("figure[data-chart='Requests'] polyline").first
    expect(requests).to_be_attached(timeout=30_000)
    first = len((requests.get_attribute("points") or "").split())
    # The follower reads /metrics at each health check (1 s here); the page polls its state.
    page.wait_for_function(
        """([n]) => {
            const line = document.querySelector("figure[data-chart='Requests'] polyline");
            return line && line.getAttribute("points").split(" ").length > n + 2;
        }""",
        arg=[first],
        timeout=30_000,
    )
    assert page.url == url
    expect(page.locator("figure[data-chart='KV token usage'] .y-ticks span").last).to_have_text(
        "100 %"
    )
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("[data-status]")).to_have_text("Stopped", timeout=60_000)
    page.reload()
    expect(page.locator("figure[data-chart='Requests'] polyline").first).to_be_attached()
