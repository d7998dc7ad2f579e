"""With Redis down, every request that queues work answers a prompt 503 with a plain message,
leaves nothing half-done, and works again once Redis is back (the real panel, its own Redis)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest
import requests

from nodes.models import Cleanup, Launch, LaunchProfile, ProfileRevision, Reservation
from nodes.models.choices import LaunchStatus
from nodes.services import tokens
from tests.conftest import database_url
from tests.factories import PASSWORD, make_node, make_user
from tests.panel import start_panel
from tests.redis_server import OwnRedis

pytestmark = pytest.mark.django_db(transaction=True)
PROMPT_S = 6  # two quick retries of a refused connection, not Celery's 20 s of them


@pytest.fixture
def world():
    node = make_node("gpu-01", host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake")
    profile = LaunchProfile.objects.create(name="qwen", created_by="olga")
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, args=["--model-path", "/m", "--tp-size", "2"], env={},
        author="olga", node=node, verdict="ok", report={},
    )  # fmt: skip
    olga = make_user("olga", "operator")
    launch = Launch.objects.create(
        revision=revision, node=node, gpus=[0, 1], port=30000, created_by="olga",
        startup_timeout_s=600, status=LaunchStatus.READY,
    )  # fmt: skip
    return {"node": node, "launch": launch, "olga": olga, "token": tokens.create(olga, "t")}


def _page_session(base: str) -> requests.Session:
    session = requests.Session()
    form = session.get(f"{base}/login/", timeout=10).text
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert token, form[:300]
    session.post(
        f"{base}/login/",
        data={"username": "olga", "password": PASSWORD, "csrfmiddlewaretoken": token[1]},
        timeout=10,
    )
    return session


def _timed(call: Callable[[], requests.Response]) -> tuple[requests.Response, float]:
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def test_with_redis_down_queueing_requests_answer_503_promptly(world, settings, tmp_path):
    redis_server = OwnRedis(tmp_path)
    redis_server.start()
    panel = start_panel(database_url(settings), redis_server.url, tmp_path)
    try:
        base, launch = panel.url, world["launch"]
        api = {"Authorization": f"Bearer {world['token']}"}
        page = _page_session(base)
        redis_server.kill()

        stop, took = _timed(
            lambda: requests.post(f"{base}/api/launches/{launch.pk}/stop", headers=api, timeout=60)
        )
        assert stop.status_code == 503 and took < PROMPT_S, (stop.status_code, took)
        assert "task queue (Redis) is unreachable" in stop.json()["detail"]

        discover, took = _timed(
            lambda: requests.post(f"{base}/api/nodes/gpu-01/discover", headers=api, timeout=60)
        )
        assert discover.status_code == 503 and took < PROMPT_S
        assert "unreachable" in discover.json()["detail"]

        clean, took = _timed(
            lambda: requests.post(
                f"{base}/api/nodes/gpu-01/cleanup", headers=api, json={}, timeout=60
            )
        )
        assert clean.status_code == 503 and took < PROMPT_S
        assert not Cleanup.objects.filter(status=Cleanup.Status.RUNNING).exists()
        job = Cleanup.objects.get()
        assert job.status == Cleanup.Status.ERROR and "not started" in job.message

        csrf = page.cookies["csrftoken"]
        stopped_page, took = _timed(
            lambda: page.post(
                f"{base}/launches/{launch.pk}/stop/",
                data={"csrfmiddlewaretoken": csrf},
                headers={"Referer": f"{base}/launches/{launch.pk}/"},
                timeout=60,
            )
        )
        assert stopped_page.status_code == 503 and took < PROMPT_S
        assert "task queue (Redis) is unreachable" in stopped_page.text
        assert "Traceback" not in stopped_page.text
        assert Launch.objects.get(pk=launch.pk).status == LaunchStatus.READY

        made, took = _timed(
            lambda: requests.post(
                f"{base}/api/launches",
                headers=api,
                json={"node": "gpu-01", "profile": "qwen", "gpus": [2, 3]},
                timeout=60,
            )
        )
        assert made.status_code == 503 and took < PROMPT_S, made.text
        new = Launch.objects.exclude(pk=launch.pk).get()
        assert new.status == LaunchStatus.ERROR and new.reason.startswith("not started")
        assert not Reservation.objects.filter(launch=new).exists()

        # Redis back: the same panel queues again, no restart needed.
        redis_server.start()
        again = requests.post(f"{base}/api/launches/{launch.pk}/stop", headers=api, timeout=60)
        assert again.status_code == 202, again.text
    finally:
        panel.proc.kill()
        panel.proc.wait()
        redis_server.kill()
