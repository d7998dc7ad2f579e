"""Journey: an operator opens a failed launch, reads its diagnosis, applies the suggested fix
as a new revision, launches that, and watches it become ready. Served by the real ASGI panel
against the simulated incident node (SGLang 0.5.9 semantics)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from nodes.models import Launch
from nodes.models.choices import LaunchStatus
from nodes.workflows import discovery, launching
from tests.browser.test_node_journey import log_in
from tests.conftest import register_sim_node
from tests.factories import make_user
from tests.fleet import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
INCIDENT = (
    "python3 -m sglang.launch_server --model-path /srv/models/kimi-k2 --tp-size 8 "
    "--trust-remote-code --mem-fraction-static 0.85 --enable-hierarchical-cache "
    "--hicache-size 300"
)


def test_read_the_diagnosis_apply_the_fix_relaunch_and_reach_ready(
    panel, page, sim_fleet, launch_workers
):
    sim = sim_fleet["incident"]
    sim.make_clean()
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    olga = make_user("olga", "operator")
    failed = launching.submit(
        node=node, command=INCIDENT, actor=olga, overrides={"budget": "reproducing the incident"}
    )
    wait_until(
        lambda: (row := Launch.objects.get(pk=failed.pk)).diagnosis and row.log_complete, 90, 0.5
    )

    log_in(page, panel.url, "olga")
    page.get_by_role("link", name="Launches").click()
    page.get_by_label("Diagnosis").select_option("host-oom-hicache")
    page.get_by_role("button", name="Filter").click()
    page.get_by_role("link", name=f"#{failed.pk}").click()

    diagnosis = page.locator("#diagnosis")
    expect(diagnosis).to_contain_text("host-oom-hicache")
    expect(diagnosis).to_contain_text("8 ranks x 300 GB = 2400 GB")
    expect(page.locator(".phase-list .stopped")).to_have_count(1)
    expect(page.locator("#launch-log .evidence").first).to_contain_text("Allocating 300.00 GB")
    expect(page.locator("figure[data-chart='Host RAM used'] polyline")).to_have_count(1)
    fix = diagnosis.locator(".fix code").inner_text()
    assert fix.startswith("--hicache-size ")

    page.get_by_role("button", name="Apply as new revision").click()
    expect(page.locator(".messages")).to_contain_text(f"Fix from launch #{failed.pk}")
    expect(page.locator(".preset")).to_contain_text(fix)
    page.get_by_role("button", name="Launch").click()

    expect(page.get_by_role("heading", name="Launch #")).to_be_visible()
    expect(page.locator("[data-status]")).to_have_text("Ready", timeout=90_000)
    relaunch = Launch.objects.exclude(pk=failed.pk).get()
    assert relaunch.status == LaunchStatus.READY and fix in relaunch.revision.command_line()
    page.once("dialog", lambda dialog: dialog.accept())  # Stop asks first
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("[data-status]")).to_have_text("Stopped", timeout=60_000)
