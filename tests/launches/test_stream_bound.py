"""Live log streams are bounded per user and end with their client (issue 33 item 16: 600
streams by one viewer held 300 web threads and Redis connections until the launch stopped)."""

from __future__ import annotations

import http.client
import urllib.parse

import pytest

from nodes.models import Launch, LaunchProfile, ProfileRevision
from nodes.models.choices import LaunchStatus
from tests.factories import make_node, make_user
from tests.fleet import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
LIMIT = 8  # RANKWISE_STREAMS_PER_USER's default


def _open(url: str, cookie: str) -> tuple[http.client.HTTPConnection, int]:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    connection.request("GET", parts.path, headers={"Cookie": cookie})
    response = connection.getresponse()
    if response.status == 200:
        response.readline()  # "retry: 1000": the stream is running
    return connection, response.status


def test_one_user_holds_a_bounded_number_of_streams_and_a_closed_one_frees_its_place(panel):
    node = make_node("gpu-01")
    profile = LaunchProfile.objects.create(name="qwen", created_by="pat")
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, args=["--model-path", "/m"], env={}, author="pat", node=node,
        verdict="ok", report={},
    )  # fmt: skip
    launch = Launch.objects.create(
        revision=revision, node=node, gpus=[0], port=30000, created_by="pat",
        startup_timeout_s=60, status=LaunchStatus.READY,
    )  # fmt: skip
    viewer, other = make_user("vic", "viewer"), make_user("val", "viewer")
    url = f"{panel.url}/launches/{launch.pk}/events/"
    cookie = panel.cookie_for(viewer)
    held = []
    try:
        for _ in range(LIMIT):
            connection, status = _open(url, cookie)
            held.append(connection)
            assert status == 200
        extra, status = _open(url, cookie)
        extra.close()
        assert status == 429
        # Another user is not held back by this one's streams.
        theirs, status = _open(url, panel.cookie_for(other))
        theirs.close()
        assert status == 200
        # A stream whose client went is ended, and its place is free again.
        held.pop().close()

        def reopened() -> bool:
            connection, status = _open(url, cookie)
            if status == 200:
                held.append(connection)
            else:
                connection.close()
            return status == 200

        assert wait_until(reopened, 30)
    finally:
        for connection in held:
            connection.close()
