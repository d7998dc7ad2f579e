"""Smaller rough edges a new operator hits (issue 19, item 11): the login form's inputs line
up; the bundle page explains its format itself, with no path into a repository."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.test_node_journey import log_in
from tests.factories import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_login_inputs_line_up(live_server, page):
    page.goto(f"{live_server.url}/login/")
    name, password = page.get_by_label("Username"), page.get_by_label("Password")
    first, second = name.bounding_box(), password.bounding_box()
    assert first and second
    assert abs(first["x"] - second["x"]) < 1 and abs(first["width"] - second["width"]) < 1


def test_the_bundle_page_says_the_format_without_a_repository_path(live_server, page):
    make_user("otto", "operator")
    log_in(page, live_server.url, "otto")
    page.goto(f"{live_server.url}/diagnose/")
    expect(page.locator("main")).not_to_contain_text("tests/fixtures")
    page.locator(".bundle-format summary").click()
    expect(page.locator(".bundle-format pre")).to_contain_text('"format": "rankwise-case/1"')
