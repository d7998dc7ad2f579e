"""Journey: a failed launch left memory held with no process; the operator cleans up its GPUs
from the launch page, reads the checklist, and finds the GPUs quarantined on the node page."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from nodes.models import Launch
from nodes.workflows import discovery, launching
from tests.browser.test_node_journey import log_in
from tests.conftest import register_sim_node
from tests.factories import make_user
from tests.fleet import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
# The incident, forced past pre-flight on the node with the incident's aftermath (leak-on-crash).
INCIDENT = (
    "python3 -m sglang.launch_server --model-path /srv/models/kimi-k2 --tp-size 8 "
    "--mem-fraction-static 0.93 --enable-hierarchical-cache --hicache-size 300 --trust-remote-code"
)


def test_clean_up_a_failed_launch_then_see_the_quarantine_on_the_node(
    panel, page, sim_fleet, launch_workers
):
    sim = sim_fleet["leaky"]
    sim.make_clean()
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    olga = make_user("olga", "operator")
    failed = launching.submit(
        node=node, command=INCIDENT, actor=olga, overrides={"budget": "the incident, on purpose"}
    )
    wait_until(
        lambda: (row := Launch.objects.get(pk=failed.pk)).status == "failed" and row.log_complete,
        90,
        0.5,
    )
    try:
        log_in(page, panel.url, "olga")
        page.goto(f"{panel.url}/launches/{failed.pk}/")
        expect(page.locator(".held-gpus")).to_contain_text("Memory is still held on GPUs 0, 1, 2")
        page.get_by_role("link", name="Clean up GPUs").click()

        # GPU memory stayed with no process: the ranks the OOM killer took, and TP0 (SIGKILL).
        expect(page.locator("#gpu-holders tr[data-gpu='0'] strong")).to_contain_text("GiB")
        page.get_by_label("Kill the launch's processes and recover these GPUs").check()
        page.get_by_role("button", name="Clean up").click()

        steps = page.locator("#cleanup-steps")
        expect(steps).to_have_attribute("data-status", "done", timeout=120_000)
        expect(page.locator(".checklist li")).to_have_count(8)
        expect(page.locator("[data-step='g']")).to_contain_text("not supported")
        expect(page.locator("[data-step='h']")).to_contain_text("quarantined")
        expect(page.locator(".verdict")).to_contain_text("reboot")

        page.get_by_role("link", name="leaky").first.click()
        expect(page.locator(".quarantine")).to_have_count(8)
        expect(page.locator(".quarantine").first).to_contain_text("driver reload or a reboot")
        expect(page.locator("#gpu-holders")).to_contain_text("quarantined")
    finally:
        sim.reboot()
