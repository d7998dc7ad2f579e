"""The stand-in's memory arithmetic, written from shared/reference/sglang.md §2–§3.

Independent of Rankwise's own budget code on purpose: end-to-end tests compare the two.
Bytes everywhere; "GB" in SGLang's log lines means GiB for device memory and 10^9 for the host
pool, exactly as SGLang prints them.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Any

GiB = 2**30
GB = 10**9
HOST_RESERVE_BYTES = 10 * GiB  # SGLang keeps 10 GiB of host RAM back (§2)


@dataclass
class Model:
    path: str
    config: dict[str, Any]
    weights_bytes: int
    #: (name, dtype, shape) of every tensor in the shards' safetensors headers; empty when the
    #: shards have no readable header (then each rank holds checkpoint ÷ (tp × pp)).
    tensors: list[tuple[str, str, list[int]]] = field(default_factory=list)

    @property
    def text(self) -> dict[str, Any]:
        """The language model's config (multimodal configs nest it under ``text_config``)."""
        nested = self.config.get("text_config")
        return {**self.config, **nested} if isinstance(nested, dict) else self.config

    @property
    def architecture(self) -> str:
        return str((self.config.get("architectures") or ["UnknownForCausalLM"])[0])

    @property
    def attention_layers(self) -> int:
        """Layers that keep KV: all, or the full-attention ones of a hybrid (``layer_types``)."""
        kinds = self.text.get("layer_types")
        if isinstance(kinds, list) and "linear_attention" in kinds:
            return sum(k == "full_attention" for k in kinds)
        return int(self.text["num_hidden_layers"])

    @property
    def linear_layers(self) -> int:
        return int(self.text["num_hidden_layers"]) - self.attention_layers

    @property
    def is_mla(self) -> bool:
        return "kv_lora_rank" in self.text

    @property
    def dtype(self) -> str:
        return "torch." + str(self.config.get("torch_dtype", "bfloat16"))


def load_model(path: str) -> Model:
    """Read ``config.json`` and sum the checkpoint files; OSError as transformers raises it."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise OSError(
            f"{path} is not a local folder and is not a valid model identifier listed on "
            "'https://huggingface.co/models'\nIf this is a private repository, make sure to pass "
            "a token having permission to this repo either by logging in with `hf auth login` "
            "or by passing `token=<your_token>`"
        )
    if not os.path.isfile(config_path):
        raise OSError(f"{path} does not appear to have a file named config.json.")
    with open(config_path) as handle:
        config = json.load(handle)
    names = sorted(os.listdir(path))
    weights = sum(
        os.path.getsize(os.path.join(path, name))
        for name in names
        if name.endswith((".safetensors", ".bin", ".pt"))
    )
    found: list[tuple[str, str, list[int]]] = []
    for name in names:
        if name.endswith(".safetensors"):
            with open(os.path.join(path, name), "rb") as handle:
                head = handle.read(8)
                if len(head) < 8:
                    return Model(path, config, weights)
                doc = json.loads(handle.read(struct.unpack("<Q", head)[0]) or b"{}")
            found += [(k, v["dtype"], v["shape"]) for k, v in doc.items() if k != "__metadata__"]
    return Model(path, config, weights, found)


# SGLang's loading rules (models/deepseek_v2.py, kimi_k25.py, linear.py; sglang.md §3b): these
# modules are ReplicatedLinear or plain parameters, whole on every TP rank.
WHOLE_ON_EVERY_RANK = re.compile(
    r"q_a_proj|kv_a_proj_with_mqa|_layernorm|\.norm\d?\.|\.mlp\.gate\.|"
    r"e_score_correction_bias|weight_shape|vision_tower\..*\.mlp\.|mm_projector"
)
SIZES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8, "F8_E4M3": 1, "U8": 1, "I8": 1}
ALLOCATOR_SLACK = 600 * 2**20  # the caching allocator keeps about 0.6 GiB after loading


def weights_per_rank(model: Model, tp: int, pp: int) -> int:
    """Bytes of weights one rank holds after loading: column/row/vocab-parallel and expert
    tensors split over TP, replicated ones whole, KV heads replicated when TP exceeds them,
    the w_kc/w_vc copies MLA keeps of kv_b_proj, and allocator slack."""
    if not model.tensors:
        return model.weights_bytes // (tp * pp)
    text = model.text
    kv_heads = int(text.get("num_key_value_heads") or text.get("num_attention_heads") or 1)
    held = 0.0
    for name, dtype, shape in model.tensors:
        size = SIZES[dtype]
        for dim in shape:
            size *= dim
        if WHOLE_ON_EVERY_RANK.search(name):
            held += size
        elif re.search(r"\.(k|v)_proj\.", name):
            held += size * max(1, kv_heads // tp) / kv_heads
        else:
            held += size / tp
    if model.is_mla:  # w_kc and w_vc, bf16, this rank's heads
        heads = max(1, int(text["num_attention_heads"]) // tp)
        per_head = int(text["qk_nope_head_dim"]) + int(text["v_head_dim"])
        held += heads * per_head * int(text["kv_lora_rank"]) * int(text["num_hidden_layers"]) * 2
    return int(held / pp) + ALLOCATOR_SLACK


def elem_bytes(kv_cache_dtype: str, model: Model) -> int:
    if kv_cache_dtype.startswith("fp8") or kv_cache_dtype == "mxfp8":
        return 1
    if kv_cache_dtype.startswith("fp4") or kv_cache_dtype in ("nvfp4",):
        return 1  # packed with scales: no smaller than a byte per element in the pool
    return 4 if model.text.get("torch_dtype") == "float32" else 2


def cell_bytes(model: Model, tp: int, pp: int, elem: int) -> int:
    """KV bytes per token on one rank: MLA latent replicated per rank; MHA/GQA sharded by heads."""
    c = model.text
    layers = -(-model.attention_layers // pp)
    if model.is_mla:
        return (int(c["kv_lora_rank"]) + int(c["qk_rope_head_dim"])) * layers * elem
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    return 2 * max(1, kv_heads // tp) * head_dim * layers * elem


def state_bytes_per_request(model: Model, tp: int, pp: int) -> tuple[int, int]:
    """Gated DeltaNet state one request keeps on a rank (SGLang's Mamba pool, §3 hybrid):
    the conv state (bf16, kernel − 1 steps of q, k and v) and the recurrent state (fp32,
    value heads × key dim × value dim), for this rank's heads and layers: (conv, ssm) bytes."""
    c = model.text
    nk, nv = int(c["linear_num_key_heads"]) // tp, int(c["linear_num_value_heads"]) // tp
    dk, dv = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
    conv = (2 * nk * dk + nv * dv) * (int(c["linear_conv_kernel_dim"]) - 1) * 2
    ssm = nv * dk * dv * 4
    layers = -(-model.linear_layers // pp)
    return conv * layers, ssm * layers


def default_mem_fraction(gpu_total_bytes: int, tp: int, pp: int) -> float:
    """SGLang 0.5.2's heuristic (§1c): reserve by GPU class, then mfs = (mem − reserve) / mem."""
    gpu = gpu_total_bytes / GiB
    if gpu < 35:
        reserve = 2.8 + tp * pp / 10
    elif gpu < 90:
        reserve = 9.5 + tp * pp / 2
    elif gpu < 160:
        reserve = 12 + tp * pp / 2
    else:
        reserve = 32
    return round((gpu - reserve) / gpu, 3)


def graph_bytes(gpu_total_bytes: int) -> int:
    """CUDA graphs take a few GB per GPU on real hardware: 1 GiB plus 2% of the GPU."""
    return GiB + gpu_total_bytes // 50


def host_pool_tokens(
    version: tuple[int, ...],
    device_tokens: int,
    cell: int,
    hicache_size_gb: int,
    ratio: float,
    page_size: int,
) -> int:
    """Host (L2) pool tokens of one rank (§2): ``--hicache-size`` in decimal GB wins over ratio."""
    tokens = hicache_size_gb * GB // cell if hicache_size_gb > 0 else int(device_tokens * ratio)
    if version <= (0, 5, 5):
        return tokens // page_size * page_size
    return (tokens // page_size + 1) * page_size
