"""The stand-in under load (issue 20, item 5): ``python -m simfleet load`` drives it; it admits
against its device pool and queues the rest, caches shared prefixes, reports SGLang's gauges on
/metrics and its decode-batch lines in the log, and the load stops by itself."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fleet import wait_until
from tests.simfleet.test_sglang_standin import fresh, health, log_of, start  # noqa: F401

QWEN = "--model-path /srv/models/qwen2.5-7b --tp-size 2 --enable-metrics"
POOL = 40_000


def _load(node, *extra: str, seconds: float = 6) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "simfleet", "load", node.name, "--port=30000", "--state",
         node.state, f"--seconds={seconds}", *extra],
        capture_output=True, text=True, timeout=seconds + 60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _gauges(node) -> dict[str, float]:
    text = node.ok("curl -s http://127.0.0.1:30000/metrics")
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("tp_rank") == "0":
                found[sample.name.removeprefix("sglang:")] = sample.value
    return found


@pytest.fixture
def server(fresh):  # noqa: F811
    node = fresh("spare")
    start(node, f"{QWEN} --max-total-tokens {POOL}")
    assert wait_until(lambda: health(node) == "200", 90)
    return node


def test_unique_prompts_fill_the_pool_and_queue_the_rest(server):
    summary = {}

    def sample():
        gauges = _gauges(server)
        # Once every client has sent its first request (building 40 prompts takes a moment).
        return gauges if gauges["num_queue_reqs"] >= 25 and gauges["token_usage"] > 0.85 else None

    with subprocess.Popen(
        [sys.executable, "-m", "simfleet", "load", server.name, "--port=30000", "--state",
         server.state, "--seconds=20", "--concurrency=40", "--input-tokens=4000",
         "--output-tokens=200"], stdout=subprocess.PIPE, text=True,
    ) as load:  # fmt: skip
        gauges = wait_until(sample, 30, 0.3)
        summary = json.loads(load.communicate(timeout=60)[0])
    # 40,000 tokens hold 9 requests of 4,000 + what they generate; 40 clients, so ~31 wait.
    assert gauges["num_running_reqs"] == pytest.approx(POOL // 4200, abs=1)
    assert gauges["cache_hit_rate"] < 0.05
    assert gauges["max_total_num_tokens"] == POOL
    # The load stopped by itself and dropped what was open; the server takes new work.
    assert summary["completed"] > 0 and summary["dropped"] > 0 and summary["errors"] == 0
    assert wait_until(lambda: _gauges(server)["num_running_reqs"] == 0, 10)
    # The tokenizer manager's counters: every finished request, every first token. A request
    # the server finished in the instant its client gave up at the deadline counts there and
    # is dropped here, so the server's count lies between the two tallies.
    after = _gauges(server)
    finished = after["num_requests_total"]
    assert summary["completed"] <= finished <= summary["completed"] + summary["dropped"]
    assert after["prompt_tokens_total"] == 4000 * finished
    assert after["time_to_first_token_seconds_count"] >= finished
    assert after["time_to_first_token_seconds_sum"] > 0
    lines = re.findall(
        r"Decode batch, #running-req: (\d+), #token: (\d+), token usage: ([\d.]+), cuda graph: "
        r"True, gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+),",
        log_of(server),
    )
    assert lines and max(int(r) for r, *_ in lines) <= POOL // 4000


def test_a_shared_prefix_is_cached_once_and_more_requests_run(server):
    summary = _load(server, "--concurrency=30", "--input-tokens=4000", "--output-tokens=100",
                    "--shared-prefix=0.9")  # fmt: skip
    gauges = _gauges(server)
    assert summary["completed"] > 30 and summary["cached_tokens"] > 0
    # 3,600 of 4,000 tokens come from the cache once the first request has put them there.
    assert gauges["cache_hit_rate"] == pytest.approx(0.9, abs=0.05)
    assert re.search(r"#cached-token: [1-9]", log_of(server))


@pytest.mark.parametrize("bad", ["--concurrency=0", "--seconds=100000", "--shared-prefix=1.5"])
def test_a_load_out_of_bounds_is_refused_and_sends_nothing(server, bad):
    args = ["--concurrency=2", "--input-tokens=10", "--output-tokens=5", "--seconds=1", bad]
    done = subprocess.run(
        [sys.executable, "-m", "simfleet", "load", server.name, "--port=30000", "--state",
         server.state, *args], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "must be between" in done.stderr
    assert _gauges(server)["num_running_reqs"] == 0


def test_a_request_longer_than_the_pool_holds_is_refused_as_sglang_refuses_it(server):
    body = json.dumps({"input_ids": [7] * 30_000, "sampling_params": {"max_new_tokens": 20_000}})
    out = server.ok(
        f"curl -s -o /dev/stdout -w ' %{{http_code}}' -H 'Content-Type: application/json' "
        f"--data-binary '{body}' http://127.0.0.1:30000/generate"
    )
    assert out.endswith(" 400") and "exceeds the model's maximum context length" in out
    bad = json.dumps({"input_ids": [7, 8], "sampling_params": {"max_new_tokens": "many"}})
    out = server.ok(
        f"curl -s -w ' %{{http_code}}' -H 'Content-Type: application/json' "
        f"--data-binary '{bad}' http://127.0.0.1:30000/generate"
    )
    assert out.endswith(" 400") and _gauges(server)["num_running_reqs"] == 0
