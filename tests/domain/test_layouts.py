"""Device KV pools of the 2025–2026 layouts (hybrid state, sliding window, DSA indexer), from
observed figures, and the explicit refusal for a layout the engine does not know."""

from __future__ import annotations

from typing import Any

import pytest

from nodes.domain.budget import BudgetReport, NodeMemory, Observed, check
from nodes.domain.geometry import from_config, kv_bytes_per_token, kv_elem_bytes
from nodes.domain.sglang_flags import parse_command, split_command
from nodes.flag_tables import table

GiB = 2**30
NODE = NodeMemory((96 * GiB,) * 8, 2000 * 10**9)
GLM5 = {"num_hidden_layers": 78, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_head_dim": 128}
QWEN35_9B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "text_config": {
        "num_hidden_layers": 32,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "full_attention_interval": 4,
    },
}
GPT_OSS = {
    "architectures": ["GptOssForCausalLM"],
    "num_hidden_layers": 4,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
}


def run(flags: str, config: dict[str, Any], pre_gib: float, weights_gib: float):
    argv, _ = split_command(f"python3 -m sglang.launch_server --model-path /m {flags}")
    observed = Observed(round(pre_gib * GiB), round(weights_gib * GiB))
    return check(
        parse_command(argv, table("0.5.9")),
        NODE,
        version="0.5.9",
        geometry=from_config(config),
        observed=observed,
    )


def refusal(report: BudgetReport) -> str:
    return next(m.text for m in report.messages if m.code == "estimate_unavailable")


def test_dsa_indexer_bytes_match_the_logged_pools():
    geometry = from_config(GLM5)
    assert kv_bytes_per_token(geometry, 8, 1, kv_elem_bytes("auto")) == 100_152  # K31, bf16
    assert kv_bytes_per_token(geometry, 8, 1, kv_elem_bytes("fp8_e4m3")) == 61_464  # K17, fp8


def test_an_indexer_model_reproduces_its_log():
    # kv-observations K31: GLM-5 NVFP4, TP8, 0.92; avail after load 36.93 + 57.06 GiB weights.
    report = run("--tp-size 8 --mem-fraction-static 0.92", GLM5, 36.93 + 57.06, 57.06)
    assert report.device_kv_tokens_per_rank == pytest.approx(314_304, rel=0.01)


def test_a_hybrid_model_gives_the_state_pool_its_share():
    # kv-observations K28: Qwen3.5-9B, TP2, 0.8: 9.49 GiB rest, 4.48 GiB state, 5.00 GiB KV.
    report = run("--tp-size 2 --mem-fraction-static 0.8", QWEN35_9B, 22.93, 8.85)
    assert report.device_kv_tokens_per_rank == pytest.approx(327_310, rel=0.01)
    assert any("state pool (24 linear-attention/Mamba layers)" in line for line in report.lines)
    # A larger state ratio leaves fewer KV tokens, as in SGLang.
    more_state = run(
        "--tp-size 2 --mem-fraction-static 0.8 --mamba-full-memory-ratio 2.0",
        QWEN35_9B,
        22.93,
        8.85,
    )
    assert more_state.device_kv_tokens_per_rank < report.device_kv_tokens_per_rank


def test_a_fixed_state_pool_without_state_sizes_is_refused_with_the_reason():
    report = run(
        "--tp-size 2 --mem-fraction-static 0.8 --max-mamba-cache-size 360", QWEN35_9B, 22.93, 8.85
    )
    assert report.device_kv_tokens_per_rank is None
    assert refusal(report).startswith("estimate unavailable: --max-mamba-cache-size")


def test_sliding_window_layers_share_the_rest_by_the_swa_ratio():
    report = run("--mem-fraction-static 0.5", GPT_OSS, 80, 10)
    per_layer = 2 * 8 * 64 * 2
    rest = round(80 * GiB) - round(10 * GiB) - int(round(80 * GiB) * 0.5)
    full = int(rest / (per_layer * (0.8 * 2 + 2)))
    assert report.device_kv_tokens_per_rank == full
    assert any(f"SWA pool {int(full * 0.8):,}" in line for line in report.lines)
    plain = run("--mem-fraction-static 0.5 --disable-hybrid-swa-memory", GPT_OSS, 80, 10)
    assert plain.device_kv_tokens_per_rank == rest // (per_layer * 4)


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (
            {
                "num_hidden_layers": 24,
                "num_key_value_heads": 8,
                "head_dim": 64,
                "ssm_state_size": 16,
            },
            "config.json has ssm_state_size",
        ),
        (
            {
                "num_hidden_layers": 2,
                "num_key_value_heads": 8,
                "head_dim": 64,
                "layer_types": ["rwkv", "full_attention"],
            },
            "layer type rwkv is not a layout the engine knows",
        ),
    ],
)
def test_an_unknown_hybrid_is_refused_never_guessed(config, why):
    report = run("--mem-fraction-static 0.8", config, 80, 10)
    assert report.device_kv_tokens_per_rank is None and report.verdict == "warn"
    assert refusal(report).startswith("estimate unavailable: ") and why in refusal(report)


def test_a_standard_attention_config_is_estimated_whatever_its_architecture():
    config = {
        "architectures": ["SomethingNewForCausalLM"],
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "head_dim": 64,
    }
    report = run("--mem-fraction-static 0.15", config, 14.70, 0.98)  # K20's figures
    assert report.device_kv_tokens_per_rank == pytest.approx(107_319, rel=0.01)


def test_page_size_and_the_token_cap():
    config = {"num_hidden_layers": 24, "num_key_value_heads": 2, "head_dim": 64}
    paged = run("--mem-fraction-static 0.15 --page-size 64", config, 14.70, 0.98)
    assert paged.device_kv_tokens_per_rank % 64 == 0
    capped = run("--mem-fraction-static 0.15 --max-total-tokens 5000", config, 14.70, 0.98)
    assert capped.device_kv_tokens_per_rank == 5000


def test_dp_attention_shards_kv_heads_by_the_attention_tp():
    config = {"num_hidden_layers": 10, "num_key_value_heads": 8, "head_dim": 128}
    plain = run("--tp-size 8 --mem-fraction-static 0.8", config, 80, 10)
    dp = run(
        "--tp-size 8 --dp-size 4 --enable-dp-attention --mem-fraction-static 0.8", config, 80, 10
    )
    # 8 KV heads: 1 per rank at attention TP 8, 4 per rank at attention TP 8 ÷ 4 = 2.
    assert plain.device_kv_tokens_per_rank == pytest.approx(4 * dp.device_kv_tokens_per_rank, abs=4)
