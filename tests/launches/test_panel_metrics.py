"""``/metrics`` of the panel, as Prometheus scrapes it: read by ``prometheus_client``'s own
parser; a team-only profile's name is not in it; a token is needed."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodes.models import Launch, LaunchProfile, ProfileRevision, Team
from nodes.models.choices import LaunchStatus
from nodes.services import tokens
from tests.factories import make_node, make_user

pytestmark = pytest.mark.django_db


def _launch(node, name: str, status: str, metrics: dict | None, **profile) -> Launch:
    row = LaunchProfile.objects.create(name=name, created_by="pat", **profile)
    revision = ProfileRevision.objects.create(
        profile=row, number=1, args=["--model-path", "/m"], env={}, author="pat", node=node,
        verdict="ok", report={},
    )  # fmt: skip
    return Launch.objects.create(
        revision=revision, node=node, gpus=[len(Launch.objects.all())], port=30000 + row.pk,
        created_by="pat", startup_timeout_s=60, status=status, metrics=metrics,
    )  # fmt: skip


def test_every_running_server_is_a_labelled_gauge_and_team_only_names_stay_out(client):
    node = make_node("gpu-01")
    load = {
        "token_usage": 0.91,
        "num_running_reqs": 50,
        "num_queue_reqs": 98,
        "gen_throughput": 500,
    }
    open_ = _launch(node, "kimi-k2-tp8", LaunchStatus.READY, load)
    team = Team.objects.create(name="research")
    secret = _launch(node, "secret-model", LaunchStatus.READY, {"token_usage": 0.1},
                     team=team, visibility="team")  # fmt: skip
    _launch(node, "gone", LaunchStatus.STOPPED, load)
    token = tokens.create(make_user("prom", "viewer"), "prometheus")
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    text = response.content.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    usage = {s.labels["launch"]: s for s in families["rankwise_server_token_usage"].samples}
    assert usage[str(open_.pk)].value == 0.91
    assert usage[str(open_.pk)].labels == {"launch": str(open_.pk), "node": "gpu-01",
                                            "profile": "kimi-k2-tp8"}  # fmt: skip
    assert usage[str(secret.pk)].labels["profile"] == "team-only"
    assert "secret-model" not in text and "gone" not in text
    queued = families["rankwise_server_num_queue_reqs"].samples
    assert [s.value for s in queued] == [98.0]


def test_without_a_token_nothing_is_said(client):
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
