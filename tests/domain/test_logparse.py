"""Start-up phases and their numbers, from SGLang's log lines (sglang.md §6)."""

from __future__ import annotations

import pytest

from nodes.domain.logparse import Progress, advance

STARTUP_059 = """\
[2026-12-01 10:00:00 TP0] Init torch distributed begin.
[2026-12-01 10:00:01 TP0] Load weight begin. avail mem=95.41 GB
Loading safetensors checkpoint shards:  50% Completed | 32/64 [00:04<00:04,  1.20it/s]
[2026-12-01 10:00:09 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=32.08 GB, mem usage=63.33 GB.
[2026-12-01 10:00:09 TP0] KV Cache is allocated. #tokens: 271502, KV size: 17.77 GB
[2026-12-01 10:00:09 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=14.01 GB
[2026-12-01 10:00:12 TP0] Capture cuda graph end. Time elapsed: 3.00 s. mem usage=2.92 GB. avail mem=11.09 GB.
[2026-12-01 10:00:12 TP0] max_total_num_tokens=271502, chunked_prefill_size=8192, context_len=131072
[2026-12-01 10:00:12 TP0] Allocating 37.00 GB host memory for hierarchical KV cache.
[2026-12-01 10:00:12 TP1] Allocating 37.00 GB host memory for hierarchical KV cache.
[2026-12-01 10:00:14] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2026-12-01 10:00:15] The server is fired up and ready to roll!
"""


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
