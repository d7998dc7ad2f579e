"""Every page names its icon, and the icon is served: no 404 in the browser's console on any
page (browsers ask for /favicon.ico whatever a page links)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_pages_link_an_icon_that_is_served_and_favicon_ico_leads_to_it(viewer_client):
    page = viewer_client.get("/")
    assert page.status_code == 200
    icon = re.search(r'<link rel="icon" href="([^"]+)"', page.content.decode())
    assert icon, "no icon link"
    served = Client().get(icon[1])
    assert served.status_code == 200 and b"<svg" in served.getvalue()
    asked = Client().get("/favicon.ico")
    assert asked.status_code == 301 and asked["Location"] == icon[1]
