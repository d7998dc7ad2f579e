"""The planner in the profile form (issue 20, item 4): for tokens in and out per request and a
target of requests at once, the settings that reach it on the form's node, each as the budget
checks it; applying one sets the form's flags and saves nothing."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from nodes.domain.units import GB
from nodes.models import LaunchProfile, ModelReading
from simfleet.models import MODELS, _size, tensors
from tests.factories import make_node, profile_form_data

pytestmark = pytest.mark.django_db
KIMI = "/srv/models/kimi-k2"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake"


@pytest.fixture
def node():
    node = make_node("gpu-01", host_key=KEY, mem_available_bytes=440 * GB, sglang_version="0.5.9")
    ModelReading.objects.create(
        node=node, model_path=KIMI, host=node.host, read_at=timezone.now(),
        answer={"config": MODELS["kimi-k2"]["config"],
                "weights_bytes": sum(_size(t) for t in tensors("kimi-k2"))},
    )  # fmt: skip
    return node


def _form(node, **workload: str) -> dict:
    data = profile_form_data(
        node, model_path=KIMI, mem_fraction_static="0.85", enable_hicache="", hicache_size="",
        extra_flags="--trust-remote-code", action="",
    )  # fmt: skip
    return {**data, **workload}


def _rows(body: str) -> list[tuple[str, int]]:
    rows = re.findall(r'<td class="mono">([^<]*)</td><td><span class="badge[^>]*>(\w+)</span></td>'
                      r"<td>(\d+)</td>", body)  # fmt: skip
    return [(setting, int(fit)) for setting, _, fit in rows]


def test_the_planner_finds_the_least_change_that_reaches_the_seed_workload(operator_client, node):
    workload = {"plan_input_tokens": "4000", "plan_output_tokens": "400", "plan_concurrency": "28"}
    body = operator_client.post(reverse("nodes:profile-check"), _form(node, **workload)).content
    body = body.decode()
    rows = _rows(body)
    as_is = dict(rows)["as it is"]
    assert as_is < 28  # ~116,000 tokens ÷ 4,400 at 0.85
    reached = re.search(r"Reaches 28 at once with <code class=\"mono\">([^<]+)</code>", body)
    assert reached, body[body.find('id="planner"') :][:3000]
    setting = reached[1]
    assert dict(rows)[setting] >= 28
    assert not any("hicache" in s or "hierarchical" in s for s, _ in rows)


def test_a_target_no_setting_reaches_says_how_far_the_best_falls_short(operator_client, node):
    workload = {"plan_input_tokens": "4000", "plan_output_tokens": "400", "plan_concurrency": "150"}
    body = operator_client.post(reverse("nodes:profile-check"), _form(node, **workload)).content
    body = body.decode()
    assert "No setting tried here reaches 150 at once on gpu-01" in body
    best = max(fit for _, fit in _rows(body))
    assert f"at most {best:,} whole requests of 4,400 tokens" in body and best < 150
    assert "A host pool (HiCache) holds prefixes, not running requests" in body


def test_applying_a_planned_setting_fills_the_form_and_saves_nothing(operator_client, node):
    workload = {"plan_input_tokens": "4000", "plan_output_tokens": "400", "plan_concurrency": "28"}
    change = {"--kv-cache-dtype": "fp8_e5m2"}
    page = operator_client.post(
        reverse("nodes:profile-create"),
        {**_form(node, **workload), "plan_change": json.dumps(change)},
    )
    body = page.content.decode()
    assert "Applied the planned setting: --kv-cache-dtype fp8_e5m2" in body
    assert re.search(r'name="kv_cache_dtype"[^>]*>.*?<option value="fp8_e5m2" selected', body, re.S)
    assert not LaunchProfile.objects.exists()
    # A setting the planner does not offer is refused, and the form is as it was.
    forged = {"--hicache-size": 300}
    page = operator_client.post(
        reverse("nodes:profile-create"),
        {**_form(node, **workload), "plan_change": json.dumps(forged)},
    )
    assert "The planner does not offer that setting now" in page.content.decode()
    assert not LaunchProfile.objects.exists()


@pytest.mark.parametrize("bad", [{"plan_input_tokens": "4k"}, {"plan_concurrency": "0"},
                                 {"plan_output_tokens": "99999999999"}])  # fmt: skip
def test_a_bad_workload_gets_a_message_and_the_budget_still_shows(operator_client, node, bad):
    workload = {"plan_input_tokens": "4000", "plan_output_tokens": "400", "plan_concurrency": "28"}
    response = operator_client.post(
        reverse("nodes:profile-check"), _form(node, **{**workload, **bad})
    )
    body = response.content.decode()
    assert response.status_code == 200 and 'class="bad plan-error"' in body
    assert "The arithmetic" in body and '<table class="plans">' not in body


@pytest.mark.parametrize("extra", ["--trust-remote-code --tp-size 0",
                                   "--trust-remote-code --mem-fraction-static=-inf"])  # fmt: skip
def test_nonsense_flags_are_planned_quickly_or_not_at_all(viewer_client, node, extra):
    workload = {"plan_input_tokens": "4000", "plan_output_tokens": "400", "plan_concurrency": "28"}
    data = {**_form(node, **workload), "extra_flags": extra}
    response = viewer_client.post(reverse("nodes:profile-check"), data)
    assert response.status_code == 200 and 'id="budget-panel"' in response.content.decode()


def test_a_deeply_nested_planned_change_is_no_offer(operator_client, node):
    workload = {"plan_input_tokens": "4000", "plan_output_tokens": "400", "plan_concurrency": "28"}
    data = {**_form(node, **workload), "plan_change": "[" * 50_000}
    page = operator_client.post(reverse("nodes:profile-create"), data)
    assert page.status_code == 200 and "No planned setting to apply" in page.content.decode()
    assert not LaunchProfile.objects.exists()


def test_enter_with_nothing_pasted_keeps_the_fields(operator_client, node):
    data = {**_form(node, plan_input_tokens="4000"), "action": "load", "pasted_command": ""}
    data["tp_size"] = "4"
    body = operator_client.post(reverse("nodes:profile-create"), data).content.decode()
    assert "Nothing pasted to load" in body
    assert re.search(r'name="tp_size" value="4"', body) and KIMI in body
    assert not LaunchProfile.objects.exists()
