"""Cleanup pages without a node: roles, the checklist as recorded, quarantine on the node page."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from nodes.models import Cleanup, CleanupStep, GpuQuarantine
from tests.factories import make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def node():
    return make_node("gpu-01", gpus=2)


def test_viewers_cannot_open_or_post_the_cleanup_form(viewer_client, node):
    url = reverse("nodes:node-cleanup", args=[node.pk])
    assert viewer_client.get(url).status_code == 403
    assert viewer_client.post(url, {"gpus": [0], "confirm": "on"}).status_code == 403
    assert not Cleanup.objects.exists()


def test_the_checklist_shows_each_step_its_command_output_and_measurements(viewer_client, node):
    job = Cleanup.objects.create(
        node=node,
        gpus=[0],
        requested_by="olga",
        status="done",
        message="GPU 0 quarantined: 60 GiB held with no process and no GPU reset possible.",
        result={"gpus": [{"index": 0, "state": "quarantined", "memory_used_bytes": 60 * 2**30,
                          "orphaned_bytes": 60 * 2**30, "holders": [],
                          "quarantine_reason": "needs a reboot"}], "host": {}},
    )  # fmt: skip
    now = timezone.now()
    CleanupStep.objects.create(
        cleanup=job, number=1, key="g", title="Reset GPUs", outcome="failed",
        command="nvidia-smi --gpu-reset -i 0", output="GPU 00000000:01:00.0: not supported",
        before={"gpus": {"0": {"state": "held", "used_bytes": 60 * 2**30, "holders": []}},
                "mem_available_bytes": 10**9},
        after={"gpus": {"0": {"state": "held", "used_bytes": 60 * 2**30, "holders": []}},
               "mem_available_bytes": 10**9},
        started=now, finished=now,
    )  # fmt: skip
    page = viewer_client.get(reverse("nodes:cleanup-detail", args=[job.pk])).content.decode()
    assert "g. Reset GPUs" in page and "$ nvidia-smi --gpu-reset -i 0" in page
    assert "not supported" in page and "64.4 GB" not in page and "60 GiB" in page
    assert "quarantined" in page and "needs a reboot" in page


def test_a_quarantined_gpu_shows_on_the_node_page(viewer_client, node):
    GpuQuarantine.objects.create(node=node, index=1, reason="60 GiB held with no process")
    page = viewer_client.get(reverse("nodes:node-detail", args=[node.pk])).content.decode()
    assert page.count('class="quarantine"') == 1 and "60 GiB held with no process" in page


def test_odd_poll_counts_and_untrusted_nodes_get_words_not_errors(operator_client, node):
    """A poll count that is no small number is counted from 0 (never a 500), and a node whose
    host key nobody trusted is not read at all: the panel and the form say why."""
    for tries in ("²", "9" * 5000, "-3", "x"):
        for name in ("nodes:node-gpus", "nodes:node-cleanup"):
            response = operator_client.get(reverse(name, args=[node.pk]), {"tries": tries})
            assert response.status_code == 200, (name, tries)
            assert "host key is not trusted yet" in response.content.decode()
    assert not Cleanup.objects.exists()


def test_the_api_refuses_a_cleanup_of_a_node_nobody_trusted(operator, node):
    from django.test import Client

    from nodes.services import tokens

    api = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.create(operator, 't')}")
    answer = api.post(
        f"/api/nodes/{node.name}/cleanup", {"gpus": [0]}, content_type="application/json"
    )
    assert answer.status_code == 400 and "not trusted yet" in answer.json()["detail"]
    assert not Cleanup.objects.exists()
