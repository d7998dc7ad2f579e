"""A running launch's capacity (issue 20): the incident's first chapter from the gauges the
panel sampled, and options each checked by the budget — and by ``manage.py budget`` — before
they are offered; the API and the CLI answer the same document."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from nodes.domain.units import GB, GiB
from nodes.models import Launch, LaunchProfile, ModelReading, ProfileRevision, Reservation
from nodes.models.choices import LaunchStatus
from nodes.services import capacity, tokens
from simfleet.models import MODELS, _size, tensors
from tests.cases import budget_with_change
from tests.conftest import manage_py
from tests.factories import make_node, make_user

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake"
KIMI = "/srv/models/kimi-k2"
ARGS = ["--model-path", KIMI, "--tp-size", "8", "--mem-fraction-static", "0.85",
        "--trust-remote-code", "--enable-metrics"]  # fmt: skip
WEIGHTS = sum(_size(t) for t in tensors("kimi-k2"))


def _incident() -> Launch:
    """The incident's server as the panel saw it: 8 × 96 GiB, 449 GB, SGLang 0.5.9; a pool of
    116,171 tokens; 46–56 running, 94–101 queued, usage 0.85–0.96 for a minute."""
    node = make_node("gpu-01", host_key=KEY, mem_available_bytes=440 * GB, sglang_version="0.5.9")
    ModelReading.objects.create(
        node=node, model_path=KIMI, host=node.host, read_at=timezone.now(),
        answer={"config": MODELS["kimi-k2"]["config"], "weights_bytes": WEIGHTS},
    )  # fmt: skip
    profile = LaunchProfile.objects.create(name="kimi-k2-tp8", created_by="pat")
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, args=ARGS, env={}, author="pat", node=node, verdict="ok",
        report={},
    )  # fmt: skip
    series = [
        {"t": 600.0 + 5 * i, "token_usage": 0.85 + 0.01 * (i % 12), "num_running_reqs": 46 + i % 11,
         "num_queue_reqs": 101 - i % 8, "gen_throughput": 500.0}
        for i in range(13)
    ]  # fmt: skip
    info = {"max_total_num_tokens": 116_171, "mem_fraction_static": 0.85, "tp_size": 8,
            "kv_cache_dtype": "auto"}  # fmt: skip
    return Launch.objects.create(
        revision=revision, node=node, gpus=list(range(8)), port=30000, created_by="pat",
        startup_timeout_s=600, status=LaunchStatus.READY, server_info=info,
        metrics_series=series,
    )  # fmt: skip


@pytest.mark.django_db
def test_the_incident_is_kv_bound_and_every_option_passes_manage_py_budget(tmp_path):
    launch = _incident()
    found = capacity.capacity_of(launch)
    assert found["bottleneck"] == "kv-bound" and found["held_s"] >= 30
    assert found["figures"]["pool_tokens"] == 116_171
    assert 94 <= found["figures"]["queued"] <= 101
    changes = [o["change"] for o in found["options"]]
    assert {"--mem-fraction-static"} in [set(c) for c in changes]
    assert {"--kv-cache-dtype": "fp8_e5m2"} in changes
    for option in found["options"]:
        assert option["verdict"] in ("ok", "warn")
        assert option["expected_running_requests"] > found["figures"]["running"]
        assert "--hicache-size" not in option["change"]  # never a host pool for concurrency
        status, report = budget_with_change(_facts(launch), option["change"], tmp_path)
        assert status == 0 and report["verdict"] in ("ok", "warn"), (option, report["messages"])


def _facts(launch: Launch) -> dict:
    node = launch.node
    return {
        "command": ["python3", "-m", "sglang.launch_server", *launch.revision.args],
        "node": {
            "host_ram_bytes": node.host_ram_bytes,
            "mem_available_bytes": node.mem_available_bytes,
            "gpus": [{"memory_total_bytes": 96 * GiB}] * 8,
        },
        "model_config": MODELS["kimi-k2"]["config"],
        "model_weights_bytes": WEIGHTS,
        "engine_version": node.sglang_version,
    }


@pytest.mark.django_db
def test_a_quiet_server_is_not_bound_and_is_offered_nothing():
    launch = _incident()
    launch.metrics_series = [
        {"t": 5.0 * i, "token_usage": 0.2, "num_running_reqs": 3, "num_queue_reqs": 0}
        for i in range(10)
    ]
    launch.save(update_fields=["metrics_series"])
    found = capacity.capacity_of(launch)
    assert found["bottleneck"] == "none" and found["options"] == []


@pytest.mark.django_db(transaction=True)
def test_the_api_and_the_cli_answer_the_same_document(client, settings):
    launch = _incident()
    user = make_user("vic", "viewer")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(user, 'test')}"}
    api = client.get(f"/api/launches/{launch.pk}/capacity", **headers)
    assert api.status_code == 200
    keys = {"launch", "bottleneck", "held_s", "figures", "options", "why"}
    assert set(api.json()) == keys
    assert all(
        set(o) == {"change", "verdict", "expected_running_requests", "expected_throughput_change",
                   "why"}
        for o in api.json()["options"]
    )  # fmt: skip
    done = manage_py(settings, "capacity", str(launch.pk), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == api.json()
    assert manage_py(settings, "capacity", "999999").returncode == 2
    assert client.get("/api/launches/999999/capacity", **headers).status_code == 404


@pytest.mark.django_db
def test_the_launch_page_names_the_bottleneck_and_an_option_saves_a_checked_revision(
    operator_client,
):
    launch = _incident()
    page = operator_client.get(reverse("nodes:launch-detail", args=[launch.pk])).content.decode()
    assert 'data-bottleneck="kv-bound"' in page and "What would lift it?" in page
    # Its figures read as numbers, not floats: a share in per cent, a mean to one decimal.
    shown = dict(re.findall(r"<dt>([^<]+)</dt><dd>([^<]+)</dd>", page))
    assert re.fullmatch(r"\d+\.\d %", shown["token usage"]), shown
    assert re.fullmatch(r"\d+(\.\d)?", shown["queued"]) and shown["pool tokens"] == "116,171"
    assert "Load over the launch" in page and 'data-chart="Requests"' in page
    options = operator_client.get(reverse("nodes:launch-capacity", args=[launch.pk]))
    assert "fp8_e5m2" in options.content.decode()
    url = reverse("nodes:launch-capacity-apply", args=[launch.pk])
    refused = operator_client.post(url, {"change": '{"--hicache-size": 300}'}, follow=True)
    assert "Not saved: that change is not offered" in refused.content.decode()
    assert not ProfileRevision.objects.filter(number=2).exists()
    # The running server still holds its port: the relaunch is offered the next one (a trial
    # found the form kept the held port and the launch was blocked).
    Reservation.objects.get_or_create(
        node=launch.node, kind="port", number=launch.port, defaults={"launch": launch}
    )
    saved = operator_client.post(url, {"change": '{"--kv-cache-dtype": "fp8_e5m2"}'})
    revision = ProfileRevision.objects.get(number=2)
    assert revision.args[-2:] == ["--kv-cache-dtype", "fp8_e5m2"] and revision.verdict != "block"
    assert saved.status_code == 302 and "/launches/new/" in saved["Location"]
    assert f"port={launch.port + 1}" in saved["Location"]
    form = operator_client.get(saved["Location"]).content.decode()
    assert f"Port {launch.port} is still held, so the relaunch takes port {launch.port + 1}" in form
    assert f'value="{launch.port + 1}"' in form


def _with_hits(launch: Launch, rate: float) -> Launch:
    launch.metrics_series = [{**s, "cache_hit_rate": rate} for s in launch.metrics_series]
    launch.save(update_fields=["metrics_series"])
    return launch


@pytest.mark.django_db
def test_unique_prompts_get_no_host_pool_and_shared_prefixes_one_that_fits(tmp_path):
    unique = capacity.capacity_of(_with_hits(_incident(), 0.01))
    assert not any("--enable-hierarchical-cache" in o["change"] for o in unique["options"])

    launch = _with_hits(Launch.objects.get(), 0.62)
    found = capacity.capacity_of(launch)
    assert found["figures"]["cache_hit_rate"] == 0.62
    [host] = [o for o in found["options"] if "--enable-hierarchical-cache" in o["change"]]
    size = host["change"]["--hicache-size"]
    # Per rank, 8 ranks: all of them together within the node's host memory, never 300 each.
    assert size >= 1 and size * 8 * GB < launch.node.mem_available_bytes
    assert "62%" in host["why"] and "does not raise" in host["why"]
    assert host["expected_running_requests"] == round(found["figures"]["running"])
    assert host["expected_throughput_change"] == 1.0
    status, report = budget_with_change(_facts(launch), host["change"], tmp_path)
    assert status == 0 and report["verdict"] in ("ok", "warn"), report["messages"]
