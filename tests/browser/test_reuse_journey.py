"""Journey: find the profile known-good on a node, clone it to a smaller node, accept the change
the panel proposes there, save it, launch it, and see it ready."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from nodes.models import KnownGoodStamp, Launch
from nodes.models.choices import LaunchStatus
from nodes.services.model_facts import model_facts
from nodes.services.profiles import evaluate, save_revision
from nodes.workflows import discovery, ending, launching
from tests.browser.test_node_journey import log_in
from tests.conftest import register_sim_node
from tests.factories import make_user
from tests.fleet import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
ARGS = [
    "--model-path", "/srv/models/qwen2.5-7b", "--tp-size", "2",
    "--enable-hierarchical-cache", "--hicache-size", "150",
]  # fmt: skip


def ready_node(sim: Any) -> Any:
    sim.reboot()
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    node.refresh_from_db()
    return node


def test_find_known_good_clone_to_a_smaller_node_accept_the_change_launch(
    panel, page, sim_fleet, launch_workers
):
    big, small = ready_node(sim_fleet["incident"]), ready_node(sim_fleet["spare"])
    olga = make_user("olga", "operator")
    model = model_facts(big, "/srv/models/qwen2.5-7b")
    revision = save_revision(
        profile_name="qwen-hicache", args=ARGS, env={}, message="fits the 449 GB node",
        node=big, report=evaluate(ARGS, big, model), model=model, actor=olga,
    )  # fmt: skip
    first = launching.submit(node=big, revision=revision, actor=olga, gpus=[0, 1])
    wait_until(lambda: KnownGoodStamp.objects.filter(launch=first).exists(), 90, 0.5)
    ending.stop(first.pk, actor=olga)

    log_in(page, panel.url, "olga")
    page.get_by_role("link", name="Launch profiles").click()
    page.get_by_label("Known-good on node").select_option("incident")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator(".stamp").first).to_contain_text("known-good @1 on incident")
    page.get_by_role("link", name="qwen-hicache").click()
    page.get_by_role("link", name="Clone @1 to another node").click()
    page.get_by_label("Target node").select_option(label=f"spare ({small.gpu_summary()})")
    page.get_by_role("button", name="Check on this node").click()

    check = page.locator(".clone-check")
    expect(check).to_contain_text("What must change on spare")
    proposed = check.locator(".changes strong").first.inner_text()
    assert int(proposed) < 150
    # The table reads as a table: its first row below the header, not beside it.
    header = check.locator(".changes thead tr").bounding_box()
    row = check.locator(".changes tbody tr").first.bounding_box()
    assert header and row and row["y"] >= header["y"] + header["height"] - 1, (header, row)
    page.get_by_role("link", name="Accept the change and edit").click()
    expect(page.locator(".clone-note")).to_contain_text(f"--hicache-size {proposed}")
    acknowledge = page.get_by_label("I have read the warnings", exact=False)
    if acknowledge.count():
        acknowledge.check()
    page.get_by_role("button", name="Save revision").click()

    expect(page.get_by_role("heading", name="qwen-hicache-spare")).to_be_visible()
    page.get_by_role("link", name="Launch @1").click()
    page.get_by_role("button", name="Launch").click()
    expect(page.locator("[data-status]")).to_have_text("Ready", timeout=90_000)
    launch = Launch.objects.exclude(pk=first.pk).get()
    assert launch.node == small and launch.status == LaunchStatus.READY
    assert f"--hicache-size {proposed}" in launch.revision.command_line()
    page.once("dialog", lambda dialog: dialog.accept())  # Stop asks first
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("[data-status]")).to_have_text("Stopped", timeout=60_000)
