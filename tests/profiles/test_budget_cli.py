"""``manage.py budget``: the JSON contract and exit codes (0 ok/warn, 1 block, 2 unusable)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KIMI = {
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "hidden_size": 7168,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
}
INCIDENT = [
    "python3",
    "-m",
    "sglang.launch_server",
    "--model-path",
    "/m",
    "--tp-size",
    "8",
    "--mem-fraction-static",
    "0.93",
    "--enable-hierarchical-cache",
    "--hicache-size",
]


@pytest.fixture
def files(tmp_path):
    node = tmp_path / "node.json"
    node.write_text(
        json.dumps(
            {
                "name": "gpu-01",
                "host_ram_bytes": 449 * 10**9,
                "gpus": [{"name": "NVIDIA H200", "memory_total_bytes": 96 * 2**30}] * 8,
            }
        )
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps(KIMI))
    return node, config


def budget(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "budget", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_incident_blocks_with_exit_1_and_the_json_contract(files):
    node, config = files
    result = budget(
        "--node",
        str(node),
        "--model-config",
        str(config),
        "--weights-bytes",
        str(544 * 10**9),
        "--available-bytes",
        str(408 * 10**9),
        "--json",
        "--",
        *INCIDENT,
        "300",
    )
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "block"
    assert doc["ranks_per_node"] == 8
    assert doc["host_pool_bytes_per_node"] == 8 * doc["host_pool_bytes_per_rank"]
    assert doc["host_budget_bytes"] < 449 * 10**9
    assert doc["device_kv_tokens_per_rank"] > 0
    assert {"level", "code", "text"} <= set(doc["messages"][0])
    assert doc["suggestion"] == {"--hicache-size": 37}


def test_the_fix_exits_0(files):
    node, config = files
    result = budget("--node", str(node), "--json", "--", *INCIDENT, "37")
    assert result.returncode == 0, result.stdout
    doc = json.loads(result.stdout)
    assert doc["verdict"] in ("ok", "warn") and doc["device_kv_tokens_per_rank"] is None


def test_values_sglang_rejects_are_a_block_with_json(files):
    node, _ = files
    result = budget("--node", str(node), "--json", "--", *INCIDENT, "37.5")
    assert result.returncode == 1
    assert json.loads(result.stdout)["messages"][0]["code"] == "flag_invalid"


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--node", "/nonexistent.json"], "--node: cannot read /nonexistent.json"),
        (["--node", "BAD"], "--node: BAD is not JSON"),
    ],
)
def test_an_unusable_command_line_exits_2_with_one_line(files, tmp_path, args, reason):
    if args[1] == "BAD":
        bad = tmp_path / "BAD"
        bad.write_text("{not json")
        args = ["--node", str(bad)]
        reason = f"--node: {bad} is not JSON"
    result = budget(*args, "--json", "--", *INCIDENT, "37")
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and reason in result.stderr


@pytest.mark.parametrize(
    "node_text",
    [
        '{"host_ram_bytes": Infinity, "gpus": []}',
        '{"host_ram_bytes": 1e400, "gpus": []}',
        '{"host_ram_bytes": ' + "9" * 5000 + ', "gpus": []}',
        "[" * 100000 + "]" * 100000,
        '{"host_ram_bytes": -5, "gpus": []}',
        "[]",
    ],
)
def test_unusable_node_files_exit_2(tmp_path, node_text):
    node = tmp_path / "node.json"
    node.write_text(node_text)
    result = budget("--node", str(node), "--json", "--", *INCIDENT, "37")
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


def test_an_unusable_config_exits_2(files, tmp_path):
    node, _ = files
    config = tmp_path / "c.json"
    config.write_text("[]")
    result = budget("--node", str(node), "--model-config", str(config), "--", *INCIDENT, "37")
    assert result.returncode == 2 and "--model-config" in result.stderr


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--weights-per-rank-bytes", "-5", "--weights-per-rank-bytes -5: a size in bytes"),
        ("--free-before-load-bytes", "-1", "--free-before-load-bytes -1: a size in bytes"),
        (
            "--free-before-load-bytes",
            str(200 * 2**30),
            "is more than a GPU of --node has (103,079,215,104 bytes)",
        ),
    ],
)
def test_an_observed_figure_out_of_range_is_refused_naming_itself(files, option, value, said):
    """Found by a reviewer: a negative figure was reported against --node, and free memory
    larger than the card was accepted."""
    from tests.conftest import manage_in_process

    node, _ = files
    done = manage_in_process(
        "budget", "--node", str(node), f"{option}={value}", "--", *INCIDENT, "37"
    )
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "--node:" not in done.stderr
