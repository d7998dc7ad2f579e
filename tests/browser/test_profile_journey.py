"""Journey: paste the incident's command, see it blocked with the numbers, fix the size, save."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from nodes.domain.units import GB
from nodes.models import ProfileRevision
from tests.browser.test_node_journey import log_in
from tests.factories import make_node, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
INCIDENT = (
    "python3 -m sglang.launch_server --model-path /models/kimi-k2 --tp-size 8 "
    "--mem-fraction-static 0.93 --enable-hierarchical-cache --hicache-size 300 --trust-remote-code"
)


def test_paste_blocked_fix_save(live_server, page):
    make_user("otto", "operator")
    make_node(
        "gpu-01", host_ram_bytes=449 * GB, mem_available_bytes=408 * GB, sglang_version="0.5.9"
    )
    log_in(page, live_server.url, "otto")
    page.get_by_role("link", name="Launch profiles").click()
    page.get_by_role("link", name="New profile").click()
    page.locator("#id_name").fill("kimi-k2-tp8")
    page.locator("#id_node").select_option(label="gpu-01")
    page.get_by_label("Start from a command line").fill(INCIDENT)
    page.get_by_role("button", name="Load pasted command").click()

    panel = page.locator("#budget-panel")
    expect(panel).to_contain_text("BLOCK")
    expect(panel).to_contain_text("8 × 300 GB = 2400 GB of pinned host memory")
    expect(panel).to_contain_text("that is 37 GB per rank")
    expect(page.get_by_label("Host pool per TP rank (GB, 10^9 bytes)")).to_have_value("300")

    page.get_by_role("button", name="Save revision").click()
    expect(page.locator(".form-errors")).to_contain_text("Blocked")
    assert not ProfileRevision.objects.exists()

    size = page.get_by_label("Host pool per TP rank (GB, 10^9 bytes)")
    size.fill("37")
    size.blur()
    expect(panel).to_contain_text("WARN")  # updated live, without a reload
    expect(panel).to_contain_text("8 ranks = 296")
    expect(page.get_by_label("Start from a command line")).to_have_value("")
    expect(size).to_have_value("37")

    page.get_by_label("I have read the warnings").check()
    page.get_by_role("button", name="Save revision").click()
    expect(page.locator(".messages")).to_contain_text("Saved kimi-k2-tp8@1")
    expect(page.locator("#revision-1 .dry-run")).to_contain_text("--hicache-size 37")
    assert ProfileRevision.objects.get().args[-1] == "--trust-remote-code"
