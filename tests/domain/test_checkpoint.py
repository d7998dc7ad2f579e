"""Weights per rank from safetensors headers (nodes.domain.checkpoint) and the node-side header
reader (the node agent's ``model`` command, nodes/remote/agent.py) on a sparse model folder."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodes.domain import weights
from nodes.domain.checkpoint import HeaderError, per_rank

GiB = 2**30
ROOT = Path(__file__).resolve().parents[2]
S01 = json.loads((ROOT / "tests/fixtures/cases/S01/facts.json").read_text())
KIMI_K25 = S01["model_config"]


def kimi_k25_int4() -> list[list[Any]]:
    """Kimi-K2.5 INT4's tensors (compressed-tensors pack-quantized, group 32; attention, shared
    experts, dense MLP, lm_head and vision in bf16), grouped as the header reader prints them."""
    h, experts, inter, moe_inter = 7168, 384, 18432, 2048
    groups: list[list[Any]] = [
        ["model.embed_tokens.weight", "BF16", [163840, h], 1],
        ["lm_head.weight", "BF16", [163840, h], 1],
        ["model.norm.weight", "BF16", [h], 1],
    ]
    attn = {
        "q_a_proj.weight": [1536, h],
        "q_a_layernorm.weight": [1536],
        "q_b_proj.weight": [64 * 192, 1536],
        "kv_a_proj_with_mqa.weight": [576, h],
        "kv_a_layernorm.weight": [512],
        "kv_b_proj.weight": [64 * 256, 512],
        "o_proj.weight": [h, 64 * 128],
    }
    for name, shape in attn.items():
        groups.append([f"model.layers.*.self_attn.{name}", "BF16", shape, 61])
    for norm in ("input_layernorm", "post_attention_layernorm"):
        groups.append([f"model.layers.*.{norm}.weight", "BF16", [h], 61])
    for proj, shape in (
        ("gate_proj", [inter, h]),
        ("up_proj", [inter, h]),
        ("down_proj", [h, inter]),
    ):
        groups.append([f"model.layers.*.mlp.{proj}.weight", "BF16", shape, 1])
    groups += [
        ["model.layers.*.mlp.gate.weight", "BF16", [experts, h], 60],
        ["model.layers.*.mlp.gate.e_score_correction_bias", "F32", [experts], 60],
    ]
    for proj, (rows, cols) in (
        ("gate_proj", (moe_inter, h)),
        ("up_proj", (moe_inter, h)),
        ("down_proj", (h, moe_inter)),
    ):
        groups.append(
            [f"model.layers.*.mlp.shared_experts.{proj}.weight", "BF16", [rows, cols], 60]
        )
        base = f"model.layers.*.mlp.experts.*.{proj}"
        groups += [
            [f"{base}.weight_packed", "I32", [rows, cols // 8], 60 * experts],
            [f"{base}.weight_scale", "BF16", [rows, cols // 32], 60 * experts],
            [f"{base}.weight_shape", "I64", [2], 60 * experts],
        ]
    v, v_inter = 1152, 4304
    vision = {
        "attn.wqkv.weight": [3 * v, v],
        "attn.wo.weight": [v, v],
        "mlp.fc0.weight": [v_inter, v],
        "mlp.fc1.weight": [v, v_inter],
        "norm0.weight": [v],
        "norm1.weight": [v],
    }
    for name, shape in vision.items():
        groups.append([f"vision_tower.encoder.blocks.*.{name}", "BF16", shape, 27])
    groups += [
        ["mm_projector.linear_1.weight", "BF16", [4 * v, 4 * v], 1],
        ["mm_projector.linear_2.weight", "BF16", [h, 4 * v], 1],
    ]
    return groups


def test_kimi_k25_int4_headers_give_the_logged_weights_per_rank():
    groups = kimi_k25_int4()
    estimate = per_rank(groups, KIMI_K25, tp=8)
    assert "safetensors headers: 595" in estimate.lines[0]  # the real checkpoint's ~595 GB
    assert estimate.bytes_per_rank == pytest.approx(72.42 * GiB, rel=0.01)  # S01's log
    # Checkpoint ÷ TP alone would be 3 GiB short: the replicated tensors are the difference.
    assert estimate.bytes_per_rank - 595 * 10**9 / 8 > 2.5 * GiB


def test_config_arithmetic_agrees_with_the_headers():
    from_headers = per_rank(kimi_k25_int4(), KIMI_K25, tp=8).bytes_per_rank
    from_config = weights.per_rank(595 * 10**9, KIMI_K25, 8, 1).bytes_per_rank
    assert from_config == pytest.approx(from_headers, rel=0.01)


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    config = {"num_key_value_heads": 8, "num_attention_heads": 64}
    groups = [["model.layers.*.self_attn.k_proj.weight", "BF16", [8 * 128, 8192], 80]]
    at8 = per_rank(groups, config, tp=8).bytes_per_rank
    at16 = per_rank(groups, config, tp=16).bytes_per_rank
    assert at8 == at16  # one KV head per rank either way


@pytest.mark.parametrize(
    "group",
    [["x", "Q9", [1], 1], ["x", "BF16", [-1], 1], ["x", "BF16", [1]], "x"],
)
def test_malformed_groups_raise_header_error(group):
    with pytest.raises(HeaderError):
        per_rank([group], None, tp=1)


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A sparse safetensors file: a real header, the data region a hole of the right size."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape, size) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + offset)


def test_the_node_script_reads_headers_only_and_groups_layers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    tensors = {
        f"model.layers.{i}.mlp.experts.{e}.down_proj.weight": (
            "BF16",
            [1024, 1024],
            2 * 1024 * 1024,
        )
        for i in range(2)
        for e in range(3)
    }
    _write_safetensors(tmp_path / "model-00001-of-00001.safetensors", tensors)
    script = (ROOT / "nodes/remote/agent.py").read_text()
    out = subprocess.run(
        [sys.executable, "-c", script, "model", str(tmp_path)],
        capture_output=True,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["tensors"] == [
        ["model.layers.*.mlp.experts.*.down_proj.weight", "BF16", [1024, 1024], 6]
    ]
    assert doc["weights_bytes"] > 6 * 2 * 1024 * 1024
    again = subprocess.run(
        [sys.executable, "-c", script, "model", str(tmp_path), doc["stamp"]],
        capture_output=True,
        check=True,
    )
    assert json.loads(again.stdout) == {"unchanged": True, "stamp": doc["stamp"]}
    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(b"\x00" * 4)
    broken = subprocess.run(
        [sys.executable, "-c", script, "model", str(tmp_path), doc["stamp"]],
        capture_output=True,
        check=True,
    )
    assert "shorter than a safetensors header" in json.loads(broken.stdout)["headers_error"]


def test_quantized_formats_count_their_stored_bytes_and_shard_by_module():
    """FP8 block (DeepSeek-V3: weight + fp32 weight_scale_inv), NVFP4 (packed U8 + fp8 scales +
    fp32 scalars) and AWQ (qweight/qzeros/scales): the header's bytes, split by the module."""
    config = {"num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 8}
    groups = [
        ["model.layers.*.self_attn.q_a_proj.weight", "F8_E4M3", [1536, 7168], 1],  # replicated
        ["model.layers.*.self_attn.q_a_proj.weight_scale_inv", "F32", [12, 56], 1],  # replicated
        ["model.layers.*.mlp.experts.*.down_proj.weight", "F8_E4M3", [7168, 2048], 8],
        ["model.layers.*.mlp.experts.*.down_proj.weight_scale_inv", "F32", [56, 16], 8],
        ["model.layers.*.mlp.experts.*.up_proj.weight", "U8", [2048, 3584], 8],  # NVFP4 packed
        ["model.layers.*.mlp.experts.*.up_proj.weight_scale", "F8_E4M3", [2048, 448], 8],
        ["model.layers.*.mlp.experts.*.up_proj.weight_scale_2", "F32", [], 8],  # replicated
        ["model.layers.*.mlp.gate_proj.qweight", "I32", [7168, 2304], 1],  # AWQ
        ["model.layers.*.mlp.gate_proj.scales", "F16", [56, 18432], 1],
    ]
    replicated = 1536 * 7168 + 12 * 56 * 4 + 8 * 4
    sharded = (
        8 * (7168 * 2048 + 56 * 16 * 4 + 2048 * 3584 + 2048 * 448)
        + 7168 * 2304 * 4
        + 56 * 18432 * 2
    )
    expected = sharded // 4 + replicated + weights.ALLOCATOR_SLACK_BYTES
    assert per_rank(groups, config, tp=4).bytes_per_rank == expected
