"""Journey: an admin stores an SSH key, registers a simulated node, trusts its host key,
discovers it, and sees its 8 GPUs with memory bars — without a page reload for the discovery."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.test_node_journey import log_in
from tests.factories import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_register_trust_discover(live_server, page, sim_fleet, celery_worker):
    sim = sim_fleet["incident"]
    sim.make_clean()
    make_user("ada", "admin")
    log_in(page, live_server.url, "ada")

    page.get_by_role("link", name="SSH keys").click()
    page.get_by_role("link", name="Add SSH key").click()
    page.get_by_label("Name").fill("fleet")
    page.get_by_label("Private key (paste)").fill(Path(sim.key_path).read_text())
    page.get_by_role("button", name="Store key").click()
    expect(page.locator(".messages")).to_contain_text("Key fleet (SHA256:")

    page.get_by_role("link", name="Nodes").first.click()
    page.get_by_role("link", name="Add node").click()
    page.get_by_label("Name").fill("incident")
    page.get_by_label("SSH host").fill(sim.host)
    key_choice = page.get_by_label("SSH key").locator("option", has_text="fleet")
    page.get_by_label("SSH key").select_option(key_choice.get_attribute("value"))
    page.get_by_role("button", name="Add node").click()
    expect(page.get_by_role("heading", name="Host key not trusted")).to_be_visible()

    page.get_by_role("button", name="Fetch host key").click()
    expect(page.locator("#host-key")).to_contain_text(sim.host_key_fingerprint)
    page.get_by_role("button", name=re.compile("^Trust ")).click()
    expect(page.locator(".messages")).to_contain_text("Host key of incident trusted; discovering")
    expect(page.locator("#host-key")).to_have_count(0)

    page.get_by_role("button", name="Discover now").click()
    expect(page.locator("#node-live")).to_contain_text("Discovery finished.", timeout=30_000)
    expect(page.locator("#node-facts")).to_contain_text("8 × NVIDIA H200 · 96 GiB")
    expect(page.locator("#node-facts")).to_contain_text("0.5.9")
    bars = page.locator("#gpu-table .gpu-memory .bar")
    expect(bars).to_have_count(8)
    expect(page.locator("#gpu-table")).to_contain_text("0 / 96 GiB used")
    expect(page.locator("#node-facts")).to_contain_text("Ready")
