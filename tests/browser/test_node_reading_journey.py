"""Journeys (issue 19, items 4 and 9): the node page shows one reading of the GPUs, fresh; a
running server's card says where it answers and what it runs with, and sends it a request.

Right after a launch became ready, and before any heartbeat read the node again, the GPU table,
the GPU holders and the node list agree on what each GPU holds."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from nodes.models import Gpu
from nodes.workflows import ending, launching
from tests.browser.test_node_journey import log_in
from tests.browser.test_reuse_journey import ready_node
from tests.factories import make_user
from tests.launching import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
COMMAND = "python3 -m sglang.launch_server --model-path /srv/models/qwen2.5-7b --tp-size 2"
USED = re.compile(r"([\d,]+(?:\.\d+)?)")  # the first figure: GiB used ("72.5 / 80 GiB used")


def _fits_at_both_widths(page, what: str) -> None:
    """No horizontal overflow at a laptop's width and a small screen's (issue 19)."""
    for width in (1440, 1024):
        page.set_viewport_size({"width": width, "height": 900})
        wide = page.evaluate("document.documentElement.scrollWidth")
        assert wide <= width, f"{what} is {wide} px wide at {width} px"
    page.set_viewport_size({"width": 1440, "height": 900})


def _gib(text: str) -> float:
    found = USED.search(text)
    assert found, text
    return float(found[1].replace(",", ""))


def test_the_gpu_table_and_the_holders_show_the_same_fresh_reading(
    panel, page, sim_fleet, launch_workers
):
    node = ready_node(sim_fleet["spare"])
    olga = make_user("olga", "operator")
    launch = launching.submit(node=node, command=COMMAND, actor=olga)
    try:
        assert wait_for(launch, "ready", "failed", "blocked", timeout=120) == "ready"
        # The last stored reading is from before the server took its memory, as it is for up
        # to a heartbeat's interval (30 s) after a launch.
        Gpu.objects.filter(node=node).update(memory_used_bytes=0, processes=[])

        log_in(page, panel.url, "olga")
        page.goto(f"{panel.url}{reverse('nodes:node-detail', args=[node.pk])}")
        holders = page.locator('#gpu-holders tr[data-gpu="0"]')
        expect(holders).to_contain_text(f"launch #{launch.pk}", timeout=30_000)
        held_text = holders.locator("td").nth(2).inner_text()
        held = _gib(held_text)
        assert held > 1
        # The table above shows that same reading, without a reload.
        # (The owners cell names the launch from its reservation already; what must change is
        # the reading itself.)
        table = page.locator("#gpu-table tbody tr").first
        expect(table.locator(".owners")).to_contain_text("ours:", timeout=15_000)
        expect(table.locator(".gpu-memory")).to_contain_text(
            re.compile(rf"^\s*{re.escape(USED.search(held_text)[1])} /"), timeout=15_000
        )
        assert _gib(table.locator(".gpu-memory").inner_text()) == held
        expect(page.locator("#gpu-read-at")).to_contain_text("As read")

        _fits_at_both_widths(page, "the node page")

        page.get_by_role("link", name="Nodes").first.click()
        row = page.locator("#node-table tr", has_text=node.name)
        expect(row.locator(".gpu-use")).to_contain_text("2 of 2 in use")

        # Item 9: the server's card, and a test request with its answer and latency.
        page.goto(f"{panel.url}{reverse('nodes:launch-detail', args=[launch.pk])}")
        card = page.locator(".server-card")
        expect(card).to_contain_text("Through SSH")
        expect(card.locator(".effective")).to_contain_text("tp_size")
        page.get_by_role("button", name="Send a test request").click()
        answer = page.locator("#test-request .test-answer")
        expect(answer).to_contain_text("HTTP 200", timeout=30_000)
        expect(answer.locator(".answer")).to_contain_text("the stand-in does no inference")
        latency = re.compile(r"\d+(\.\d)? ms for 7 tokens")
        expect(answer.locator(".latency")).to_contain_text(latency)
        _fits_at_both_widths(page, "the running launch's page")
    finally:
        assert ending.stop(launch.pk, actor=olga).clean
