"""Issue 20, acceptance: the seed's first chapter played on the simulated fleet. Kimi-K2.5 at TP8
and --mem-fraction-static 0.85 on the incident node, 150 clients sending ~4,000-token requests
(``python -m simfleet load``): the panel names KV-bound admission from the metrics it sampled,
offers nothing that pins more host memory than the node holds, and the --mem-fraction-static
option, saved and relaunched, raises the running requests the stand-in reports as predicted.

The stand-in admits against its own device pool (``sglang/_standin/engine.py``, written from
SGLang's scheduler); the panel predicts from the gauges alone."""

from __future__ import annotations

import subprocess
import sys
from statistics import mean

import pytest

from nodes.models import Launch
from nodes.services import capacity
from nodes.workflows import ending, launching
from tests.factories import make_user
from tests.fleet import wait_until
from tests.launching import node_fixture, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
COMMAND = (
    "python3 -m sglang.launch_server --model-path /srv/models/kimi-k2 --tp-size 8 "
    "--trust-remote-code --mem-fraction-static 0.85 --enable-metrics"
)
CLIENTS, INPUT, OUTPUT = 150, 4000, 400

incident = node_fixture("incident")


def _load(sim, launch: Launch, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "simfleet", "load", sim.name, f"--port={launch.port}",
         f"--concurrency={CLIENTS}", f"--input-tokens={INPUT}", f"--output-tokens={OUTPUT}",
         f"--seconds={seconds}", "--state", sim.state],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _kv_bound(launch: Launch, *, with_options: bool = True) -> dict | None:
    launch.refresh_from_db()
    found = capacity.capacity_of(launch)
    offered = found["options"] or not with_options
    return found if found["bottleneck"] == "kv-bound" and offered else None


def test_the_seed_chapter_is_kv_bound_and_the_mem_fraction_option_lifts_it_as_predicted(
    incident, launch_workers
):
    pat = make_user("pat", "operator")
    first = launching.submit(node=incident, command=COMMAND, actor=pat)
    assert wait_for(first, "ready", "failed", "blocked", timeout=240) == "ready"
    load = _load(incident.sim, first, seconds=90)
    try:
        found = wait_until(lambda: _kv_bound(first), timeout=80, interval=1)
    finally:
        load.kill()
        load.communicate()
    figures = found["figures"]
    pool = figures["pool_tokens"]
    assert pool == first.server_info["max_total_num_tokens"]
    # ~28 requests of 4,000+ tokens fit the pool; the rest of the 150 wait.
    assert figures["requests_that_fit"] == pytest.approx(pool / (INPUT + OUTPUT / 2), rel=0.15)
    assert figures["running"] == pytest.approx(figures["requests_that_fit"], rel=0.15)
    assert figures["queued"] > 100 and figures["token_usage"] >= 0.85
    for option in found["options"]:
        assert "--hicache-size" not in option["change"]
        assert option["verdict"] in ("ok", "warn")
    [raise_mfs] = [o for o in found["options"] if "--mem-fraction-static" in o["change"]]
    assert raise_mfs["change"]["--mem-fraction-static"] > 0.85

    revision = capacity.apply_option(first, raise_mfs["change"], actor=pat)
    assert ending.stop(first.pk, actor=pat).clean
    second = launching.submit(node=incident, revision=revision, actor=pat)
    status = wait_for(second, "ready", "failed", "blocked", timeout=240)
    second.refresh_from_db()
    assert status == "ready", (second.reason, second.diagnosis)
    second.refresh_from_db()
    assert second.server_info["max_total_num_tokens"] > pool
    load = _load(incident.sim, second, seconds=90)
    try:
        wait_until(lambda: _kv_bound(second, with_options=False), timeout=80, interval=1)
    finally:
        load.kill()
        load.communicate()
    second.refresh_from_db()
    # The samples under load (requests waiting), over the 30 s the bottleneck held.
    loaded = [s for s in second.metrics_series if s.get("num_queue_reqs")]
    running = [s["num_running_reqs"] for s in loaded if s["t"] >= loaded[-1]["t"] - 30]
    assert mean(running) == pytest.approx(raise_mfs["expected_running_requests"], rel=0.15)
    assert ending.stop(second.pk, actor=pat).clean
