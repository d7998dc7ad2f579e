"""Journey: an operator keeps the fleet page open while a teammate's launch runs: its
commitment appears on the node (host RAM and GPUs), the launch runs on its GPUs, and after
the stop the commitment is gone, all without a reload. Served by the real ASGI panel."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from nodes.models import Launch
from nodes.workflows import discovery, ending, launching
from tests.browser.test_node_journey import log_in
from tests.conftest import register_sim_node
from tests.factories import make_user
from tests.launching import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
COMMAND = (
    "python3 -m sglang.launch_server --model-path /srv/models/llama-3-70b --tp-size 2 "
    "--enable-hierarchical-cache --hicache-size 20"
)


def test_the_fleet_page_shows_a_commitment_appear_run_and_go(
    panel, page, sim_fleet, launch_workers
):
    sim = sim_fleet["spare"]
    sim.make_clean()
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    olga = make_user("olga", "operator")
    make_user("vera", "viewer")

    log_in(page, panel.url, "vera")
    page.get_by_role("link", name="Fleet").click()
    spare = page.locator('[data-node="spare"]')
    expect(spare.locator('[data-host="ram"]')).to_contain_text("free")
    expect(spare.locator(".commitments")).to_have_count(0)
    url = page.url

    launch = launching.submit(node=node, command=COMMAND, actor=olga)
    # The commitment shows within a poll: 2 ranks × 20 GB of host pool, both GPUs reserved.
    expect(spare.locator(".commitments")).to_contain_text(f"#{launch.pk} (", timeout=15_000)
    expect(spare.locator(".commitments")).to_contain_text("40 GB host RAM")
    # Committed (to come) until its log shows the pools pinned, then ours; at speed 8 either.
    host = spare.locator('[data-host="ram"]')
    expect(host).to_contain_text(re.compile(r"(committed|ours) 40 GB"))
    expect(spare.locator('[data-gpu="1"]')).to_contain_text(f"reserved by #{launch.pk}")

    assert wait_for(launch, "ready", "failed", "blocked", timeout=120) == "ready", (
        Launch.objects.get(pk=launch.pk).reason
    )
    discovery.heartbeat_sweep(timeout=10)  # the heartbeat reads the GPUs the ranks now hold
    expect(spare.locator(".commitments")).to_contain_text("ready", timeout=15_000)
    # Once pinned, the host pools are ours, no longer "committed" (still to come).
    expect(spare.locator('[data-host="ram"]')).to_contain_text("ours 40 GB", timeout=15_000)
    expect(spare.locator('[data-host="ram"]')).not_to_contain_text("committed")
    expect(spare.locator('[data-gpu="0"] .bar')).to_have_attribute(
        "aria-label", re.compile(r"^ours "), timeout=15_000
    )

    assert ending.stop(launch.pk, actor=olga).clean
    discovery.heartbeat_sweep(timeout=10)
    expect(spare.locator(".commitments")).to_have_count(0, timeout=15_000)
    expect(spare.locator('[data-host="ram"]')).not_to_contain_text("committed")
    expect(spare.locator('[data-gpu="0"]')).not_to_contain_text("reserved")
    assert page.url == url  # no reload: the page polled
