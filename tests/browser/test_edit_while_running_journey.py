"""Journey (issue 19, item 2): a profile whose own server runs can take a new revision.

The revision is checked against the node as its own launch would find it (the running
server's memory is its own, not "used by others"); the panel says apart that it could not start
now beside what runs."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from nodes.models import ProfileRevision
from nodes.services.model_facts import model_facts
from nodes.services.profiles import evaluate, save_revision
from nodes.workflows import discovery, ending, launching
from tests.browser.test_node_journey import log_in
from tests.browser.test_reuse_journey import ready_node
from tests.factories import make_user
from tests.launching import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
MODEL = "/srv/models/qwen2.5-7b"
ARGS = ["--model-path", MODEL, "--tp-size", "2", "--mem-fraction-static", "0.88"]


def test_a_new_revision_while_its_own_server_runs_is_not_blocked_by_that_server(
    panel, page, sim_fleet, launch_workers
):
    node = ready_node(sim_fleet["spare"])
    olga = make_user("olga", "operator")
    model = model_facts(node, MODEL)
    first = save_revision(
        profile_name="qwen-tp2", args=ARGS, env={}, message="first", node=node,
        report=evaluate(ARGS, node, model), model=model, actor=olga,
    )  # fmt: skip
    launch = launching.submit(node=node, revision=first, actor=olga, gpus=[0, 1])
    assert wait_for(launch, "ready", "failed", "blocked", timeout=120) == "ready"
    discovery.heartbeat_sweep(timeout=10)  # the node's reading now shows the server's memory
    try:
        log_in(page, panel.url, "olga")
        page.get_by_role("link", name="Launch profiles").click()
        page.get_by_role("link", name="qwen-tp2").click()
        page.get_by_role("link", name="New revision").click()
        page.get_by_label("Environment").fill("SGLANG_LOG_LEVEL=info")
        page.get_by_label("Environment").blur()

        budget = page.locator("#budget-panel")
        # Checked again as typed (the name is sent although it cannot change), and not
        # blocked by the profile's own server.
        expect(budget).to_contain_text("SGLANG_LOG_LEVEL=info", timeout=30_000)
        expect(budget.locator("h2 .badge")).to_have_text(re.compile("^(OK|WARN)$"))
        expect(budget).not_to_contain_text("fill the static pool")
        now = page.locator("#start-now")
        expect(now).to_contain_text("Not now (saving is not refused for this)")
        expect(now).to_contain_text(f"#{launch.pk}")

        acknowledge = page.get_by_label("I have read the warnings", exact=False)
        if acknowledge.count():
            acknowledge.check()
        page.get_by_role("button", name="Save revision").click()
        expect(page.locator(".messages")).to_contain_text("Saved qwen-tp2@2")
        saved = ProfileRevision.objects.get(profile__name="qwen-tp2", number=2)
        assert saved.env == {"SGLANG_LOG_LEVEL": "info"} and saved.verdict != "block"
    finally:
        assert ending.stop(launch.pk, actor=olga).clean
