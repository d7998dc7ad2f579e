"""Live checks that read a node (the model's config.json behind a profile's budget) run for
operators only, and say what is wrong in words, never with the node's exception names: on the
simulated fleet, with real sshd."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from nodes.services import tokens
from nodes.workflows import discovery
from tests.conftest import register_sim_node
from tests.factories import make_node, make_user
from tests.factories import profile_form_data as form_data
from tests.htmx import post_until_read

pytestmark = pytest.mark.django_db(transaction=True)
NODE_WORDS = ("NotADirectoryError", "FileNotFoundError", "Traceback", "Errno")


def _check(user: Any, node: Any, model_path: str) -> str:
    client = Client()
    client.force_login(user)
    # An operator's check reads the model through a worker: the panel polls until it is read.
    return post_until_read(
        client, reverse("nodes:profile-check"), form_data(node, model_path=model_path)
    )


def test_a_viewer_probes_nothing_and_an_operator_reads_plain_words(sim_fleet, celery_worker):
    sim = sim_fleet["incident"]
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    node.refresh_from_db()
    viewer, operator = make_user("vic", "viewer"), make_user("otto", "operator")
    # The probe: a viewer's check answered the node's tracebacks for /etc/shadow.
    seen = _check(viewer, node, "/etc/shadow")
    assert "needs the operator role" in seen and "budget-panel" in seen
    assert not any(word in seen for word in NODE_WORDS)
    api = Client().post(
        "/api/profiles/validate",
        {"node": node.name, "args": ["--model-path", "/etc/shadow", "--tp-size", "8"]},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {tokens.create(viewer, 't')}",
    )
    assert api.status_code == 200 and not any(word in api.content.decode() for word in NODE_WORDS)
    # An operator's check reads the node, and says what it found in words.
    expected = {
        "/etc/shadow": "no model folder at /etc/shadow on incident",
        "/srv/models/nope": "no model folder at /srv/models/nope on incident",
        "/etc": "no config.json in /etc on incident",
        sim.models["kimi-k2"]: f"read from incident:{sim.models['kimi-k2']}",
    }
    token: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(operator, 't')}"}
    for path, words in expected.items():
        body = _check(operator, node, path)
        assert words in body, (path, body[-3000:])
        assert not any(word in body for word in NODE_WORDS), path
        if path.startswith("/etc") or "nope" in path:
            # The API's check says the same words in its messages.
            answer = (
                Client()
                .post(
                    "/api/profiles/validate",
                    {"node": node.name, "args": ["--model-path", path, "--tp-size", "8"]},
                    content_type="application/json",
                    **token,
                )
                .json()
            )
            assert {
                "level": "info",
                "code": "model-not-read",
                "text": f"Model geometry: {words}",
            } in (answer["messages"]), (path, answer["messages"])


def test_nothing_runs_on_a_node_for_a_viewer_not_even_the_gpu_holders(viewer_client, viewer):
    node = make_node("gpu-01", host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake")
    assert viewer_client.get(reverse("nodes:node-gpus", args=[node.pk])).status_code == 403
    page = viewer_client.get(reverse("nodes:node-detail", args=[node.pk])).content.decode()
    assert 'id="gpu-holders"' not in page
    token = tokens.create(viewer, "t")
    api = Client().get("/api/nodes/gpu-01/gpus", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert api.status_code == 403
