"""Model folders for the fleet: a real ``config.json`` and sparse checkpoint shards.

The shard sizes add up to the model's weight bytes (sparse files take no disk space), so anything
that sums ``*.safetensors`` sizes, like SGLang's loader or Rankwise's probe, sees real numbers.
Configs follow the public Hugging Face ``config.json`` files (see shared/reference/sglang.md §3).
"""

from __future__ import annotations

import json
import os
from typing import Any

MODELS: dict[str, dict[str, Any]] = {
    "kimi-k2": {
        # DeepSeek-V3 architecture with MLA; INT4 experts: about 544 GB of weights in total.
        "weights_bytes": 544_000_000_000,
        "shards": 64,
        "config": {
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
            "num_experts_per_tok": 8,
            "first_k_dense_replace": 1,
            "max_position_embeddings": 131072,
            "vocab_size": 163840,
            "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "compressed-tensors", "format": "int4"},
        },
    },
    "llama-3-70b": {
        "weights_bytes": 141_107_000_000,
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
        "weights_bytes": 15_231_000_000,
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
}


def create(folder: str) -> dict[str, str]:
    """Write every model under ``folder``; return ``{name: folder of that model}``. Idempotent."""
    made = {}
    for name, model in MODELS.items():
        target = os.path.join(folder, name)
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, "config.json"), "w") as handle:
            json.dump(model["config"], handle, indent=2)
        shards = model["shards"]
        each, rest = divmod(model["weights_bytes"], shards)
        weight_map = {}
        for i in range(shards):
            shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            with open(os.path.join(target, shard), "ab") as handle:
                handle.truncate(each + (rest if i == shards - 1 else 0))
            weight_map[f"model.layers.{i}.weight"] = shard
        with open(os.path.join(target, "model.safetensors.index.json"), "w") as handle:
            json.dump(
                {"metadata": {"total_size": model["weights_bytes"]}, "weight_map": weight_map},
                handle,
            )
        made[name] = target
    return made
