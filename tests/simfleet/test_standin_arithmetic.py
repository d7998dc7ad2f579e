"""The stand-in's memory arithmetic against the worked numbers in shared/reference/sglang.md §2–§3.

The module is loaded from its file: the stand-in's packages (``sglang``, ``pynvml``) must not
shadow real ones in this interpreter.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from simfleet.models import MODELS
from tests.fleet import wait_until
from tests.simfleet.test_sglang_standin import health, log_of, start

SITE = Path(__file__).resolve().parents[2] / "simfleet" / "node" / "site"
_spec = importlib.util.spec_from_file_location("standin_memory", SITE / "sglang/_standin/memory.py")
assert _spec and _spec.loader
memory = importlib.util.module_from_spec(_spec)
sys.modules["standin_memory"] = memory  # dataclasses look their module up while being built
_spec.loader.exec_module(memory)

DEEPSEEK_V3 = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
               "num_attention_heads": 128}  # fmt: skip
QWEN3_235B = {"num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4,
              "head_dim": 128}  # fmt: skip


def model(config: dict) -> object:
    return memory.Model("/m", config, 0)


@pytest.mark.parametrize(
    ("config", "tp", "pp", "elem", "expected"),
    [
        (DEEPSEEK_V3, 8, 1, 2, 70_272),  # MLA: replicated, the same at any TP
        (DEEPSEEK_V3, 1, 1, 2, 70_272),
        (MODELS["kimi-k2"]["config"], 8, 1, 2, 70_272),
        (MODELS["llama-3-70b"]["config"], 8, 1, 2, 40_960),
        (MODELS["llama-3-70b"]["config"], 4, 1, 2, 81_920),
        (MODELS["llama-3-70b"]["config"], 1, 1, 2, 327_680),
        (MODELS["llama-3-70b"]["config"], 8, 1, 1, 20_480),  # fp8 KV halves it
        (MODELS["llama-3-70b"]["config"], 8, 2, 2, 20_480),  # pp splits layers
        (QWEN3_235B, 8, 1, 2, 48_128),  # TP > KV heads: heads replicated
        (MODELS["qwen2.5-7b"]["config"], 1, 1, 2, 57_344),
    ],
)
def test_kv_bytes_per_token_per_rank(config, tp, pp, elem, expected):
    assert memory.cell_bytes(model(config), tp, pp, elem) == expected


def test_hicache_size_is_decimal_gb_per_rank():
    # Kimi-K2 TP8 --hicache-size 300: about 4.27 M tokens per rank (§3 host-pool examples).
    tokens = memory.host_pool_tokens((0, 5, 9), 1_000_000, 70_272, 300, 2.0, 1)
    assert tokens == 300 * 10**9 // 70_272 + 1  # 0.5.9+ adds one padding page
    assert 4_260_000 < tokens < 4_280_000
    assert memory.host_pool_tokens((0, 5, 2), 1_000_000, 70_272, 300, 2.0, 64) % 64 == 0


def test_ratio_path_mirrors_the_device_pool():
    assert memory.host_pool_tokens((0, 5, 9), 1_000_000, 40_960, 0, 2.0, 1) == 2_000_001


def test_default_mem_fraction_for_h200_tp8():
    assert memory.default_mem_fraction(141 * 2**30, 8, 1) == round((141 - 16) / 141, 3)


def test_logged_kv_pool_matches_bytes_per_token(sim_fleet):
    node = sim_fleet["incident"]
    node.reboot()
    start(node, "--model-path /srv/models/llama-3-70b --tp-size 8 --mem-fraction-static 0.9")
    assert wait_until(lambda: health(node) == "200", 40), log_of(node)
    line = re.search(r"\[[^\]]+ TP0\] KV Cache is allocated\. #tokens: (\d+), K size: ([\d.]+) GB, "
                     r"V size: ([\d.]+) GB", log_of(node))  # fmt: skip
    assert line, log_of(node)
    tokens, k_gib = int(line[1]), float(line[2])
    assert k_gib == pytest.approx(tokens * 40_960 / 2 / 2**30, abs=0.01)
    info = json.loads(node.ok("curl -s http://127.0.0.1:30000/get_server_info"))
    assert info["max_total_num_tokens"] == tokens
    node.ok("pkill -TERM -f '^sglang::http_server'")


def test_server_info_serves_the_resolved_fraction_and_sglangs_input_limit(sim_fleet):
    # ServerArgs resolves --mem-fraction-static before serving it; tp_worker.py limits an input
    # to min(context_len - 1, pool - 1) - 5 tokens.
    node = sim_fleet["incident"]
    node.reboot()
    start(node, "--model-path /srv/models/llama-3-70b --tp-size 8 --max-total-tokens 4000")
    assert wait_until(lambda: health(node) == "200", 40), log_of(node)
    info = json.loads(node.ok("curl -s http://127.0.0.1:30000/get_server_info"))
    total = int(node.ok("nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits"
                        " -i 0").strip()) * 2**20  # fmt: skip
    assert info["mem_fraction_static"] == round(memory.default_mem_fraction(total, 8, 1), 3)
    assert info["max_total_num_tokens"] == 4000 and info["max_req_input_len"] == 4000 - 1 - 5
    node.ok("pkill -TERM -f '^sglang::http_server'")


def test_weights_per_rank_follow_sglangs_loading_rules():
    """Kimi-K2.5 INT4 at TP8: checkpoint ÷ 8 plus the replicated tensors, the w_kc/w_vc copies
    and allocator slack: 72.42 GiB on every rank in the seed incident's log (sglang.md §3b)."""
    from simfleet.models import tensors

    kimi = memory.Model("/m", MODELS["kimi-k2"]["config"], 0, tensors("kimi-k2"))
    per_rank = memory.weights_per_rank(kimi, 8, 1)
    assert per_rank == pytest.approx(72.42 * 2**30, rel=0.01)
    assert per_rank > sum(memory.SIZES[d] * _count(s) for _, d, s in kimi.tensors) / 8 + 2 * 2**30
    llama = memory.Model("/m", MODELS["llama-3-70b"]["config"], 0, tensors("llama-3-70b"))
    # Dense GQA: only norms are whole on every rank; 8 KV heads at TP16 are replicated 2×.
    assert memory.weights_per_rank(llama, 16, 1) > memory.weights_per_rank(llama, 8, 1) / 2


def _count(shape: list[int]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def test_a_hybrid_keeps_kv_only_in_its_full_attention_layers():
    hybrid = memory.Model("/m", MODELS["qwen3-next-80b-a3b"]["config"], 0)
    assert hybrid.attention_layers == 12 and hybrid.linear_layers == 36
    assert memory.cell_bytes(hybrid, 2, 1, 2) == 2 * 1 * 256 * 12 * 2
    conv, ssm = memory.state_bytes_per_request(hybrid, 2, 1)
    assert ssm == 16 * 128 * 128 * 4 * 36  # fp32 recurrent state of this rank's value heads
    assert conv == (2 * 8 * 128 + 16 * 128) * 3 * 2 * 36
