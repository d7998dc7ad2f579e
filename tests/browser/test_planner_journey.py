"""Journey (issue 20, item 4): on the profile form an operator states a workload, sees without a
reload the settings that reach it on the node, applies one, and nothing is saved until they save."""

from __future__ import annotations

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from nodes.domain.units import GB
from nodes.models import LaunchProfile, ModelReading
from simfleet.models import MODELS, _size, tensors
from tests.browser.test_node_journey import log_in
from tests.factories import make_node, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
KIMI = "/srv/models/kimi-k2"
COMMAND = (
    f"python3 -m sglang.launch_server --model-path {KIMI} --tp-size 8 "
    "--mem-fraction-static 0.85 --trust-remote-code"
)


def test_a_workload_is_planned_and_a_setting_applied_without_saving(live_server, page):
    make_user("pia", "operator")
    node = make_node(
        "gpu-01", host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake",
        mem_available_bytes=440 * GB, sglang_version="0.5.9",
    )  # fmt: skip
    ModelReading.objects.create(
        node=node, model_path=KIMI, host=node.host, read_at=timezone.now(),
        answer={"config": MODELS["kimi-k2"]["config"],
                "weights_bytes": sum(_size(t) for t in tensors("kimi-k2"))},
    )  # fmt: skip
    log_in(page, live_server.url, "pia")
    page.get_by_role("link", name="Launch profiles").click()
    page.get_by_role("link", name="New profile").click()
    page.locator("#id_name").fill("kimi-k2-tp8")
    page.locator("#id_node").select_option(label="gpu-01")
    page.get_by_label("Start from a command line").fill(COMMAND)
    page.get_by_role("button", name="Load pasted command").click()
    panel = page.locator("#budget-panel")
    expect(panel).to_contain_text("Plan for a workload")

    url = page.url
    page.get_by_label("Tokens in").fill("4000")
    page.get_by_label("Tokens out").fill("400")
    page.get_by_label("Requests at once").fill("28")
    page.get_by_label("Requests at once").press("Tab")
    verdict = panel.locator(".plan-verdict")
    expect(verdict).to_contain_text("Reaches 28 at once with --mem-fraction-static", timeout=15_000)
    assert page.url == url  # no reload
    expect(page.get_by_label("Tokens in")).to_have_value("4000")  # what was typed stays
    row = panel.locator("table.plans tr.reaches").first
    setting = row.locator("td.mono").inner_text()
    fraction = setting.split()[-1]
    row.get_by_role("button", name="Apply").click()
    expect(page.locator(".messages")).to_contain_text(f"Applied the planned setting: {setting}")
    expect(page.locator("#id_mem_fraction_static")).to_have_value(fraction)
    assert not LaunchProfile.objects.exists()

    # A target nothing reaches says how far the best falls short.
    page.get_by_label("Requests at once").fill("150")
    page.get_by_label("Requests at once").press("Tab")
    expect(panel.locator(".plan-verdict")).to_contain_text(
        "No setting tried here reaches 150 at once on gpu-01", timeout=15_000
    )
