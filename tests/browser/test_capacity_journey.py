"""The capacity advisor on the launch page: "What would lift it?" shows its options where the
operator is looking, right under the button, and they stay while the page polls the launch's
state (found by a newcomer: they rendered about 2,300 px below and the click looked dead)."""

from __future__ import annotations

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from tests.browser.test_node_journey import log_in
from tests.factories import make_user
from tests.launches.test_capacity import _incident

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_options_open_under_the_button_and_survive_the_states_polling(live_server, page):
    make_user("otto", "operator")
    launch = _incident()
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, live_server.url, "otto")
    page.goto(f"{live_server.url}{reverse('nodes:launch-detail', args=[launch.pk])}")
    button = page.get_by_role("button", name="What would lift it?")
    button.click()
    options = page.locator("#capacity-options")
    expect(options).to_contain_text("fp8_e5m2")
    below, shown = button.bounding_box(), options.bounding_box()
    assert below and shown
    # Where the operator is looking: starting within a line or two of the button.
    assert 0 <= shown["y"] - (below["y"] + below["height"]) < 80, (below, shown)
    # The launch is running, so its state is polled (every 2 s): the options stay.
    with page.expect_response(lambda r: "part=state" in r.url):
        pass
    with page.expect_response(lambda r: "part=state" in r.url):
        pass
    expect(page.locator("#capacity-options")).to_contain_text("fp8_e5m2")
