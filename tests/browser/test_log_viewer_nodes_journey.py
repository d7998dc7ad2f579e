"""Journey (issue 22): a multi-node launch's one log shows which node printed each line, and the
Node select keeps one node's lines; a search still marks the text beside the node's tag."""

from __future__ import annotations

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from nodes.domain.log_lines import level_of, rank_of
from nodes.models import LaunchLogLine
from nodes.models.choices import LaunchStatus
from tests.browser.test_node_journey import log_in
from tests.factories import make_node, make_user
from tests.launches.test_views_launches import make_launch
from tests.launches.test_views_launches import node as node  # noqa: F401 - fixtures
from tests.launches.test_views_launches import revision as revision  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
LINES = "#launch-log span[data-seq]"


def test_a_multi_node_log_tags_each_line_with_its_node_and_filters_by_it(
    panel,
    page,
    node,
    revision,  # noqa: F811
):
    make_user("vera", "viewer")
    primary = make_launch(revision, node, status=LaunchStatus.STOPPED, last_seq=40,
                          log_complete=True)  # fmt: skip
    make_launch(revision, make_node("gpu-02"), group=primary, node_rank=1)
    LaunchLogLine.objects.bulk_create(
        LaunchLogLine(launch=primary, seq=i, text=t, level=level_of(t), rank=rank_of(t), node=n)
        for i in range(1, 41)
        for n in ["gpu-01" if i % 2 else "gpu-02"]
        for t in [f"[2026-01-01 00:00:00 TP{0 if i % 2 else 2}] line {i} from {n}"]
    )
    log_in(page, panel.url, "vera")
    page.goto(f"{panel.url}{reverse('nodes:launch-detail', args=[primary.pk])}")
    expect(page.locator(LINES)).to_have_count(40)
    expect(page.locator("#line-7 .node-tag")).to_have_text("gpu-01")
    expect(page.locator("#line-8 .node-tag")).to_have_text("gpu-02")
    expect(page.locator("#line-8")).to_have_text(
        "gpu-02[2026-01-01 00:00:00 TP2] line 8 from gpu-02\n"
    )
    # The Node select keeps one node's lines, read from the stored log.
    page.get_by_label("Node").select_option("gpu-02")
    page.wait_for_function(f"document.querySelectorAll('{LINES}').length === 20")
    seqs = page.evaluate(f"[...document.querySelectorAll('{LINES}')].map((s) => +s.dataset.seq)")
    assert seqs == list(range(2, 41, 2))
    expect(page.locator("#launch-log .node-tag").filter(has_text="gpu-01")).to_have_count(0)
    # A search within the node marks the text, and the line keeps its tag.
    page.get_by_label("Search the whole log").fill("line 12")
    page.get_by_role("button", name="Search", exact=True).click()
    expect(page.locator("#log-matches")).to_have_text("Match 1 of 1: line 12", timeout=15_000)
    expect(page.locator("#line-12 mark")).to_have_text("line 12")
    expect(page.locator("#line-12 .node-tag")).to_have_text("gpu-02")
    # Back to every node.
    page.get_by_label("Search the whole log").fill("")
    page.get_by_role("button", name="Search", exact=True).click()
    page.get_by_label("Node").select_option("")
    page.wait_for_function(f"document.querySelectorAll('{LINES}').length === 40")
    expect(page.locator("#line-12 mark")).to_have_count(0)
    expect(page.locator("#line-12 .node-tag")).to_have_text("gpu-02")
