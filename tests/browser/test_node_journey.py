"""Journey: an admin adds a node (a bad size first), a viewer finds no way to change it."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from nodes.models import Node
from tests.factories import PASSWORD, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def log_in(page, base: str, username: str) -> None:
    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Nodes")).to_be_visible()


def test_admin_adds_node_after_fixing_a_bad_size_and_viewer_cannot_change_it(live_server, page):
    make_user("ada", "admin")
    make_user("vera", "viewer")
    base = live_server.url

    log_in(page, base, "ada")
    page.get_by_role("link", name="Add node").click()
    page.get_by_label("Name").fill("gpu-01")
    page.get_by_label("SSH host").fill("10.0.0.5")
    page.get_by_label("GPU count").fill("8")
    page.get_by_label("GPU model").fill("NVIDIA H200")
    gpu_memory = page.locator("#field-gpu_memory")
    gpu_memory.locator("input").fill("9600")
    gpu_memory.locator("select").select_option("GiB")
    host_ram = page.locator("#field-host_ram")
    host_ram.locator("input").fill("449")
    host_ram.locator("select").select_option("GB")
    page.get_by_role("button", name="Add node").click()

    expect(gpu_memory.locator(".errorlist")).to_contain_text(
        "9600 GiB (10,307,921,510,400 bytes) per GPU is outside the plausible range"
    )
    assert not Node.objects.exists()
    # What the user typed is still there after the error.
    expect(page.get_by_label("Name")).to_have_value("gpu-01")
    expect(host_ram.locator("input")).to_have_value("449")

    gpu_memory.locator("input").fill("96")
    page.get_by_role("button", name="Add node").click()
    expect(page.get_by_role("heading", name=re.compile("gpu-01"))).to_be_visible()
    expect(page.locator(".messages")).to_contain_text("Node gpu-01 added.")

    page.get_by_role("link", name="Nodes").first.click()
    row = page.locator("#node-table tbody tr", has_text="gpu-01")
    expect(row).to_contain_text("8 × NVIDIA H200 · 96 GiB")
    expect(row).to_contain_text("449 GB")
    page.get_by_role("button", name="Log out").click()

    log_in(page, base, "vera")
    expect(page.locator("#node-table")).to_contain_text("gpu-01")
    expect(page.get_by_role("link", name="Add node")).to_have_count(0)
    page.get_by_role("link", name="gpu-01").click()
    expect(page.get_by_role("link", name="Edit")).to_have_count(0)
    expect(page.get_by_role("button", name="Delete")).to_have_count(0)
    node = Node.objects.get()
    response = page.goto(f"{base}/nodes/{node.pk}/edit/")
    assert response is not None and response.status == 403
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
