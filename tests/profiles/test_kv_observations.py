"""The budget engine against real SGLang start-ups (tests/fixtures/kv, a copy of
shared/reference/kv-observations.json) and against the seed incident's server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.kv_observations import (
    Observation,
    observations,
    run_budget,
    unavailable_reason,
)

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30
LOGGED = [o for o in observations() if o.logged]


def test_the_fixture_has_observations_with_every_figure_logged():
    assert len(LOGGED) >= 4, [o.id for o in LOGGED]


@pytest.mark.parametrize("obs", LOGGED, ids=[o.id for o in LOGGED])
def test_logged_figures_reproduce_the_logged_token_count(obs: Observation, tmp_path):
    doc = run_budget(obs, tmp_path)
    assert doc["returncode"] in (0, 1), doc
    assert doc["free_before_load_bytes"] == obs.free_before_load
    assert doc["weights_bytes_per_rank"] == obs.weights_per_rank
    assert doc["calibration"]["source"] == "observed"
    tokens = doc["device_kv_tokens_per_rank"]
    if tokens is None:
        reason = unavailable_reason(doc)
        assert reason and len(reason) > len("estimate unavailable: ") + 10, doc["messages"]
        pytest.fail(f"{obs.id}: {reason}")  # every logged observation has a known layout
    assert obs.observed_tokens
    assert abs(tokens - obs.observed_tokens) <= 0.01 * obs.observed_tokens, (tokens, doc["lines"])


def test_the_seed_server_without_observed_figures(tmp_path):
    """Kimi-K2.5 INT4, TP8, 8 × RTX PRO 6000 (102,641,958,912 bytes), checkpoint 595 GB,
    --mem-fraction-static 0.85, SGLang 0.5.9: it held about 116,171 KV tokens with about
    72.4 GiB of weights per rank (shared/reference/sglang.md §3b)."""
    facts = json.loads((ROOT / "tests/fixtures/cases/S01/facts.json").read_text())
    node = tmp_path / "node.json"
    node.write_text(json.dumps(facts["node"]))
    config = tmp_path / "config.json"
    config.write_text(json.dumps(facts["model_config"]))
    command = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/kimi-k2.5-int4",
        "--trust-remote-code",
        "--tp-size",
        "8",
        "--mem-fraction-static",
        "0.85",
    ]
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "budget",
            "--node",
            str(node),
            "--model-config",
            str(config),
            "--weights-bytes",
            str(595 * 10**9),
            "--sglang-version",
            "0.5.9",
            "--json",
            "--",
            *command,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr or result.stdout
    doc = json.loads(result.stdout)
    weights = doc["weights_bytes_per_rank"]
    assert abs(weights - 72.4 * GiB) <= 0.03 * 72.4 * GiB, weights / GiB
    assert doc["calibration"]["source"] == "estimate"
    tokens = doc["device_kv_tokens_per_rank"]
    assert abs(tokens - 116_171) <= 0.10 * 116_171, (tokens, doc["lines"])
