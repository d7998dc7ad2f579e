"""The history pages read at a laptop's and a small screen's width: the revision diff's cells
sit under their headers, the audit trail says what changed in words and links to the object,
and neither is wider than the window."""

from __future__ import annotations

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from nodes.models import LaunchProfile, ProfileRevision
from nodes.services.audit import record
from tests.browser.test_node_journey import log_in
from tests.factories import make_node, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
ARGS = ["--model-path", "/m", "--tp-size", "8", "--enable-hierarchical-cache", "--hicache-size"]


def _wider_than_the_window(page) -> int:
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


@pytest.mark.parametrize("width", [1440, 1024])
def test_the_diff_lines_up_and_history_fits_the_window(live_server, page, width):
    make_user("otto", "operator")
    node = make_node("gpu-01", sglang_version="0.5.9")
    profile = LaunchProfile.objects.create(name="kimi", created_by="otto")
    for number, size in ((1, "37"), (2, "300")):
        ProfileRevision.objects.create(
            profile=profile, number=number, args=[*ARGS, size], env={}, author="otto",
            node=node, verdict="ok", report={"lines": [], "messages": []},
        )  # fmt: skip
    record(
        "profile.revision_saved", actor=None, actor_name="otto", obj=profile,
        before={"args": ["--model-path", "/srv/models/" + "x" * 400] * 6},
        after={"args": ["--model-path", "/srv/models/" + "y" * 400] * 6},
    )  # fmt: skip
    page.set_viewport_size({"width": width, "height": 900})
    log_in(page, live_server.url, "otto")

    page.goto(f"{live_server.url}{reverse('nodes:profile-diff', args=[profile.pk])}?a=1&b=2")
    heads = page.locator("table.diff thead th")
    cells = page.locator("table.diff tbody tr").first.locator("td")
    assert heads.count() == cells.count() == 4
    for i in range(4):
        head, cell = heads.nth(i).bounding_box(), cells.nth(i).bounding_box()
        assert head and cell and abs(head["x"] - cell["x"]) < 1, (i, head, cell)
    assert _wider_than_the_window(page) <= 0

    page.goto(f"{live_server.url}{reverse('nodes:audit-list')}")
    row = page.locator("table.audit tbody tr", has_text="profile.revision_saved").first
    # The change in words, changed fields only, and the row links to its object.
    expect(row.locator(".changes dt")).to_have_text(["args"])
    expect(row.locator(".changes del")).to_contain_text("x" * 40)
    expect(row.locator(".changes ins")).to_contain_text("y" * 40)
    assert "{" not in row.locator(".change").inner_text()  # no raw JSON
    # The change has room to be read: not squeezed to a few characters a line.
    change, table = (
        row.locator(".change").bounding_box(),
        page.locator("table.audit").bounding_box(),
    )
    assert change and table and change["width"] >= 0.3 * table["width"], (change, table)
    row.get_by_role("link", name="kimi").click()
    expect(page.get_by_role("heading", name="kimi")).to_be_visible()
    page.go_back()
    assert _wider_than_the_window(page) <= 0
