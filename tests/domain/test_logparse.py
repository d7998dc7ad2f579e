"""Start-up phases and their numbers, from SGLang's log lines (sglang.md §6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodes.domain.logparse import Progress, advance

STARTUP_059 = (Path(__file__).parent.parent / "fixtures" / "logs" / "startup-0.5.9.log").read_text()


def run(text: str) -> Progress:
    progress = Progress()
    for line in text.splitlines():
        advance(progress, line)
    return progress


def test_a_full_startup_reaches_ready_with_the_numbers_sglang_printed():
    progress = run(STARTUP_059)
    assert progress.phase == "ready" and progress.ready_line_seen
    assert progress.fraction() == 1.0
    assert progress.numbers == {
        "avail_mem_gib": 95.41,
        "shards_percent": 50.0,
        "shards_done": 32.0,
        "shards_total": 64.0,
        "weights_gib": 63.33,
        "kv_tokens": 271502.0,
        "graph_gib": 2.92,
        "max_total_num_tokens": 271502.0,
        "host_pool_gb": 37.0,
        "host_pool_lines": 2.0,
    }


@pytest.mark.parametrize(
    ("line", "phase"),
    [
        ("[x TP3] Init torch distributed begin.", "distributed"),
        ("Loading safetensors checkpoint shards:  12% Completed | 8/64 [", "weights"),
        ("[x] KV Cache is allocated. #tokens: 1000, K size: 1.00 GB, V size: 1.00 GB", "kv_cache"),
        ("[x TP0] CUDA graph begin. avail mem=10.00 GB", "cuda_graphs"),  # 0.5.23 wording
        (
            "[x] Allocating kv hierarchical KV host pool: 5000 tokens, 12.50 GB host memory.",
            "host_pool",
        ),
        ("[x] INFO:     Application startup complete.", "warmup"),
    ],
)
def test_each_phase_is_recognised_in_the_wording_of_each_version(line, phase):
    assert run(line).phase == phase


def test_phases_never_move_backwards_when_ranks_print_out_of_order():
    progress = run(STARTUP_059)
    advance(progress, "[x TP7] Init torch distributed begin.")
    assert progress.phase == "ready"


def test_shard_progress_fills_the_weights_phase_and_a_partial_line_is_not_counted():
    progress = Progress()
    advance(progress, "Loading safetensors checkpoint shards:  50% Completed | 32/64 [")
    assert 1 / 6 < progress.fraction() < 2 / 6
    advance(progress, "[x] Allocating 37.00 GB host memory for hierarchical KV", partial=True)
    assert "host_pool_lines" not in progress.numbers


def test_unrelated_lines_change_nothing():
    progress = Progress()
    assert not advance(progress, "INFO: 127.0.0.1 - GET /health 200")
    assert progress.phase == "" and progress.fraction() == 0.0
