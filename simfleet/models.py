"""Model folders for the fleet: a real ``config.json`` and sparse safetensors shards.

Each shard is a real safetensors file: its JSON header lists the model's tensors with their real
names, dtypes and shapes, and the data region after it is a hole of the right size (sparse files
take no disk space). So anything that sums ``*.safetensors`` sizes or reads their headers, like
SGLang's loader or Rankwise's probe, sees real numbers. Configs follow the public Hugging Face
``config.json`` files (shared/reference/sglang.md §3, §3b).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from typing import Any

MODELS: dict[str, dict[str, Any]] = {
    "kimi-k2": {
        # Kimi-K2.5 INT4 (the seed incident's model): DeepSeek-V3 text stack with MLA, experts
        # compressed-tensors pack-quantized INT4 (group 32), attention, shared experts, the dense
        # MLP, lm_head and the MoonViT vision tower in bf16: about 595 GB of shards.
        "shards": 64,
        "config": {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "model_type": "kimi_k25",
            "torch_dtype": "bfloat16",
            "vision_config": {
                "model_type": "moonvit",
                "hidden_size": 1152,
                "num_hidden_layers": 27,
                "num_attention_heads": 16,
                "intermediate_size": 4304,
                "patch_size": 14,
            },
            "text_config": {
                "architectures": ["DeepseekV3ForCausalLM"],
                "model_type": "kimi_k2",
                "hidden_size": 7168,
                "intermediate_size": 18432,
                "moe_intermediate_size": 2048,
                "num_hidden_layers": 61,
                "num_attention_heads": 64,
                "num_key_value_heads": 64,
                "kv_lora_rank": 512,
                "q_lora_rank": 1536,
                "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 128,
                "v_head_dim": 128,
                "n_routed_experts": 384,
                "n_shared_experts": 1,
                "num_experts_per_tok": 8,
                "first_k_dense_replace": 1,
                "max_position_embeddings": 131072,
                "vocab_size": 163840,
                "torch_dtype": "bfloat16",
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "format": "pack-quantized",
                    "config_groups": {
                        "group_0": {
                            "targets": ["Linear"],
                            "weights": {
                                "num_bits": 4,
                                "type": "int",
                                "symmetric": True,
                                "group_size": 32,
                                "strategy": "group",
                            },
                        }
                    },
                    "ignore": [
                        "lm_head",
                        "re:.*self_attn.*",
                        "re:.*shared_experts.*",
                        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                    ],
                },
            },
        },
    },
    "llama-3-70b": {
        "shards": 30,
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_hidden_layers": 80,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 131072,
            "vocab_size": 128256,
            "rope_theta": 500000.0,
            "torch_dtype": "bfloat16",
        },
    },
    "qwen2.5-7b": {
        "shards": 4,
        "config": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "max_position_embeddings": 32768,
            "vocab_size": 152064,
            "torch_dtype": "bfloat16",
        },
    },
    "qwen3-next-80b-a3b": {
        # Hybrid: Gated DeltaNet linear attention in 3 of every 4 layers (a per-request state,
        # no KV), full attention in every 4th; MoE with 512 experts. About 160 GB in bf16.
        "shards": 41,
        "config": {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "hidden_size": 2048,
            "intermediate_size": 5120,
            "num_hidden_layers": 48,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "full_attention_interval": 4,
            "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 12,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_value_head_dim": 128,
            "num_experts": 512,
            "num_experts_per_tok": 10,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "decoder_sparse_step": 1,
            "max_position_embeddings": 262144,
            "vocab_size": 151936,
            "torch_dtype": "bfloat16",
        },
    },
}


Tensor = tuple[str, str, list[int]]  # name, safetensors dtype, shape
DTYPE_BYTES = {"BF16": 2, "F32": 4, "I32": 4, "I64": 8}


def _dense(prefix: str, hidden: int, inter: int) -> Iterator[Tensor]:
    yield f"{prefix}.gate_proj.weight", "BF16", [inter, hidden]
    yield f"{prefix}.up_proj.weight", "BF16", [inter, hidden]
    yield f"{prefix}.down_proj.weight", "BF16", [hidden, inter]


def _gqa(config: dict[str, Any], bias: bool) -> Iterator[Tensor]:
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    yield "model.embed_tokens.weight", "BF16", [vocab, hidden]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        for name, rows in (("q", heads), ("k", kv), ("v", kv)):
            yield f"{p}.self_attn.{name}_proj.weight", "BF16", [rows * head_dim, hidden]
            if bias:
                yield f"{p}.self_attn.{name}_proj.bias", "BF16", [rows * head_dim]
        yield f"{p}.self_attn.o_proj.weight", "BF16", [hidden, heads * head_dim]
        yield from _dense(f"{p}.mlp", hidden, config["intermediate_size"])
        yield f"{p}.input_layernorm.weight", "BF16", [hidden]
        yield f"{p}.post_attention_layernorm.weight", "BF16", [hidden]
    yield "model.norm.weight", "BF16", [hidden]
    yield "lm_head.weight", "BF16", [vocab, hidden]


def _kimi(config: dict[str, Any]) -> Iterator[Tensor]:
    text, vision = config["text_config"], config["vision_config"]
    h, heads = text["hidden_size"], text["num_attention_heads"]
    nope, rope, v_dim = text["qk_nope_head_dim"], text["qk_rope_head_dim"], text["v_head_dim"]
    q_lora, kv_lora = text["q_lora_rank"], text["kv_lora_rank"]
    yield "language_model.model.embed_tokens.weight", "BF16", [text["vocab_size"], h]
    for i in range(text["num_hidden_layers"]):
        p = f"language_model.model.layers.{i}"
        a = f"{p}.self_attn"
        yield f"{a}.q_a_proj.weight", "BF16", [q_lora, h]
        yield f"{a}.q_a_layernorm.weight", "BF16", [q_lora]
        yield f"{a}.q_b_proj.weight", "BF16", [heads * (nope + rope), q_lora]
        yield f"{a}.kv_a_proj_with_mqa.weight", "BF16", [kv_lora + rope, h]
        yield f"{a}.kv_a_layernorm.weight", "BF16", [kv_lora]
        yield f"{a}.kv_b_proj.weight", "BF16", [heads * (nope + v_dim), kv_lora]
        yield f"{a}.o_proj.weight", "BF16", [h, heads * v_dim]
        yield f"{p}.input_layernorm.weight", "BF16", [h]
        yield f"{p}.post_attention_layernorm.weight", "BF16", [h]
        if i < text["first_k_dense_replace"]:
            yield from _dense(f"{p}.mlp", h, text["intermediate_size"])
            continue
        experts, inter = text["n_routed_experts"], text["moe_intermediate_size"]
        yield f"{p}.mlp.gate.weight", "BF16", [experts, h]
        yield f"{p}.mlp.gate.e_score_correction_bias", "F32", [experts]
        yield from _dense(f"{p}.mlp.shared_experts", h, inter)
        for e in range(experts):
            for proj, (rows, cols) in (
                ("gate_proj", (inter, h)),
                ("up_proj", (inter, h)),
                ("down_proj", (h, inter)),
            ):
                base = f"{p}.mlp.experts.{e}.{proj}"
                yield f"{base}.weight_packed", "I32", [rows, cols // 8]
                yield f"{base}.weight_scale", "BF16", [rows, cols // 32]
                yield f"{base}.weight_shape", "I64", [2]
    yield "language_model.model.norm.weight", "BF16", [h]
    yield "language_model.lm_head.weight", "BF16", [text["vocab_size"], h]
    v, v_inter = vision["hidden_size"], vision["intermediate_size"]
    yield "vision_tower.patch_embed.proj.weight", "BF16", [v, 3, 14, 14]
    for i in range(vision["num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{i}"
        yield f"{b}.norm0.weight", "BF16", [v]
        yield f"{b}.norm1.weight", "BF16", [v]
        yield f"{b}.attn.wqkv.weight", "BF16", [3 * v, v]
        yield f"{b}.attn.wo.weight", "BF16", [v, v]
        yield f"{b}.mlp.fc0.weight", "BF16", [v_inter, v]
        yield f"{b}.mlp.fc1.weight", "BF16", [v, v_inter]
    yield "mm_projector.linear_1.weight", "BF16", [4 * v, 4 * v]
    yield "mm_projector.linear_2.weight", "BF16", [h, 4 * v]


def _qwen3_next(config: dict[str, Any]) -> Iterator[Tensor]:
    h, vocab = config["hidden_size"], config["vocab_size"]
    heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    experts, inter = config["num_experts"], config["moe_intermediate_size"]
    yield "model.embed_tokens.weight", "BF16", [vocab, h]
    for i, kind in enumerate(config["layer_types"]):
        p = f"model.layers.{i}"
        if kind == "linear_attention":
            a = f"{p}.linear_attn"
            yield f"{a}.in_proj_qkvz.weight", "BF16", [2 * nk * dk + 2 * nv * dv, h]
            yield f"{a}.in_proj_ba.weight", "BF16", [2 * nv, h]
            yield f"{a}.conv1d.weight", "BF16", [2 * nk * dk + nv * dv, 1, 4]
            yield f"{a}.dt_bias", "BF16", [nv]
            yield f"{a}.A_log", "F32", [nv]
            yield f"{a}.norm.weight", "F32", [dv]
            yield f"{a}.out_proj.weight", "BF16", [h, nv * dv]
        else:
            a = f"{p}.self_attn"
            yield f"{a}.q_proj.weight", "BF16", [2 * heads * hd, h]  # query and its gate
            yield f"{a}.k_proj.weight", "BF16", [kv * hd, h]
            yield f"{a}.v_proj.weight", "BF16", [kv * hd, h]
            yield f"{a}.o_proj.weight", "BF16", [h, heads * hd]
            yield f"{a}.q_norm.weight", "BF16", [hd]
            yield f"{a}.k_norm.weight", "BF16", [hd]
        yield f"{p}.input_layernorm.weight", "BF16", [h]
        yield f"{p}.post_attention_layernorm.weight", "BF16", [h]
        yield f"{p}.mlp.gate.weight", "BF16", [experts, h]
        yield f"{p}.mlp.shared_expert_gate.weight", "BF16", [1, h]
        yield from _dense(f"{p}.mlp.shared_expert", h, config["shared_expert_intermediate_size"])
        for e in range(experts):
            yield from _dense(f"{p}.mlp.experts.{e}", h, inter)
    yield "model.norm.weight", "BF16", [h]
    yield "lm_head.weight", "BF16", [vocab, h]


def tensors(name: str) -> list[Tensor]:
    """Every tensor of a fleet model, in checkpoint order."""
    config = MODELS[name]["config"]
    if name == "kimi-k2":
        return list(_kimi(config))
    if name == "qwen3-next-80b-a3b":
        return list(_qwen3_next(config))
    return list(_gqa(config, bias=config.get("model_type") == "qwen2"))


def _size(tensor: Tensor) -> int:
    count = DTYPE_BYTES[tensor[1]]
    for dim in tensor[2]:
        count *= dim
    return count


def _shard(path: str, items: list[Tensor]) -> dict[str, str]:
    """Write one sparse safetensors shard (real header, hole for the data) unless it is there."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in items:
        size = _size((name, dtype, shape))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    total = 8 + len(raw) + offset
    if not (os.path.exists(path) and os.path.getsize(path) == total):
        with open(path, "wb") as handle:
            handle.write(struct.pack("<Q", len(raw)) + raw)
            handle.truncate(total)
    return {name: os.path.basename(path) for name, _, _ in items}


def create(folder: str) -> dict[str, str]:
    """Write every model under ``folder``; return ``{name: folder of that model}``. Idempotent."""
    made = {}
    for name, model in MODELS.items():
        target = os.path.join(folder, name)
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, "config.json"), "w") as handle:
            json.dump(model["config"], handle, indent=2)
        for old in os.listdir(target):  # shards of an earlier layout of this folder
            if old.endswith(".safetensors") and not old.endswith(
                f"-of-{model['shards']:05d}.safetensors"
            ):
                os.unlink(os.path.join(target, old))
        items = tensors(name)
        total = sum(_size(t) for t in items)
        shards, weight_map, start = model["shards"], {}, 0
        for i in range(shards):
            # Equal byte shares, cut at tensor boundaries.
            end = start
            goal = total * (i + 1) // shards
            done = sum(_size(t) for t in items[:start])
            while end < len(items) and (done < goal or i == shards - 1):
                done += _size(items[end])
                end += 1
            shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            weight_map.update(_shard(os.path.join(target, shard), items[start:end]))
            start = end
        with open(os.path.join(target, "model.safetensors.index.json"), "w") as handle:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle)
        made[name] = target
    return made
