"""Rules for a command that does not fit the model or the node: a TP size that does not divide
the heads or exceeds the visible GPUs, a model path that does not resolve."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from nodes.domain.diagnosis.evidence import Bundle, Diagnosis, Hit, Rule

NOT_DIVISIBLE = re.compile(
    r"AssertionError: (?P<dim>\d+) is not divisible by (?P<tp>\d+)|Total number of attention "
    r"heads \((?P<heads>\d+)\) must be divisible by tensor parallel size \((?P<tp2>\d+)\)"
)


#: Heads and hidden sizes are far below this; a larger "dimension" is not a model's.
MAX_SHARDED_DIM = 10**7


def tp_divisibility(bundle: Bundle) -> Diagnosis | None:
    """A sharded dimension (attention heads, the vision tower's heads) is not a multiple of the
    TP size."""
    hit = bundle.log.first(NOT_DIVISIBLE)
    if hit is None:
        return None
    dim = int(hit[1]["dim"] or hit[1]["heads"])
    tp = int(hit[1]["tp"] or hit[1]["tp2"])
    if not 1 < dim <= MAX_SHARDED_DIM or tp < 1:
        return None
    valid = sorted(
        {d for k in range(1, math.isqrt(dim) + 1) if dim % k == 0 for d in (k, dim // k)}
    )
    nearest = min((d for d in valid if d != tp), key=lambda d: (abs(d - tp), -d))
    what = "attention heads" if hit[1]["heads"] else "heads of a sharded layer (e.g. vision heads)"
    numbers: dict[str, float] = {"tp_size": tp, "attention_heads": dim}
    numbers["suggested_tp_size"] = nearest
    weights = bundle.facts.get("model_weights_bytes")
    fit = ""
    if isinstance(weights, int | float) and weights > 0:
        bigger = min((d for d in valid if d > tp), default=nearest)
        per_gpu = math.floor(weights / 1e9 / bigger * 10 + 0.5) / 10  # half up, as people round
        numbers.update(weights_gb=round(weights / 1e9), weights_gb_per_gpu=per_gpu)
        fit = f"; {weights / 1e9:.0f} GB of weights are {per_gpu} GB per GPU at TP {bigger}"
    return Diagnosis(
        category="tp-divisibility",
        summary=(
            f"tensor-parallel size {tp} does not divide the model's {dim} {what}; valid TP sizes "
            f"are {', '.join(map(str, valid))}{fit}"
        ),
        remedy=(
            f"tp must divide attention heads: use "
            f"{'--tensor-parallel-size' if bundle.vllm else '--tp'} {nearest} (valid: "
            f"{', '.join(map(str, valid))}), or pipeline parallel instead"
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


ORDINAL = re.compile(r"CUDA error: invalid device ordinal")


def tp_gpu_mapping(bundle: Bundle) -> Diagnosis | None:
    """A rank asked for a device index beyond CUDA_VISIBLE_DEVICES (``--base-gpu-id`` is an
    index into the visible devices, not a physical id)."""
    hit = bundle.log.first(ORDINAL)
    if hit is None:
        return None
    listed = bundle.cuda_visible()
    visible, count = ",".join(listed), len(listed)
    base = bundle.count("base_gpu_id", default=0)
    tp = bundle.tp()
    numbers: dict[str, float] = {"base_gpu_id": base, "tp_size": tp}
    summary = f"GPU index out of range: base_gpu_id {base} with tp {tp}"
    remedy = "--base-gpu-id is an index into CUDA_VISIBLE_DEVICES; do not set both to physical ids"
    nodes = bundle.facts.get("nodes_in_launch")
    nodes = nodes if isinstance(nodes, int) and nodes > 1 else bundle.count("nnodes")
    gpus = bundle.node_gpus()
    if count:
        highest = count - tp
        numbers.update(visible_count=count, max_valid_base_gpu_id=highest)
        summary += (
            f", but CUDA_VISIBLE_DEVICES={visible} remaps the {count} visible GPUs to "
            f"0..{count - 1}, so a rank asks for device {base + tp - 1} of {count}"
        )
        remedy += f": --base-gpu-id {max(highest, 0)} at most (base_gpu_id + tp*dp <= visible GPUs)"
    elif nodes > 1 and gpus and gpus < tp // nodes:
        # Each node runs tp / nnodes ranks on GPU ids base .. base + that - 1.
        per = tp // nodes
        numbers.update(
            nnodes=nodes, ranks_per_node=per, visible_gpus=gpus, failing_gpu_id=base + gpus
        )
        summary = (
            f"--tp {tp} over {nodes} nodes puts {per} ranks on each node (GPU ids {base}-"
            f"{base + per - 1}), but this node shows {gpus} GPU{'s' if gpus > 1 else ''}: the "
            f"rank on GPU id {base + gpus} fails with invalid device ordinal"
        )
        remedy = (
            f"match --tp to the visible GPUs: tp = nnodes x GPUs per node (--tp {nodes * gpus} "
            f"here), or give each node {per} GPUs (in Kubernetes request nvidia.com/gpu: {per} per "
            "pod; check CUDA_VISIBLE_DEVICES)"
        )
    return Diagnosis(
        category="tp-gpu-mapping",
        summary=summary,
        remedy=remedy,
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


HF_MISSING = re.compile(
    r"HFValidationError|Repo id must be in the form|is not a local folder and is not a valid "
    r"model identifier|does not appear to have a file named config\.json|"
    # huggingface_hub: the cache folder itself is missing (an unmounted volume), or offline
    # mode with the model not in the cache.
    r"CacheNotFound|Cache directory not found|LocalEntryNotFoundError|Cannot find the requested "
    r"files in the (?:disk )?cache"
)


WORKER_IP = re.compile(r"ip=(?P<ip>\d+\.\d+\.\d+\.\d+)\)")


@dataclass(frozen=True)
class MissingModel:
    """A model path that did not resolve: the path (the parsed flag, else the command's word;
    ``None`` unknown), the nodes of the launch, the worker's address line; for a multi-node
    launch the GPUs the facts list per node (0: none) and the TP size as given."""

    hit: Hit
    path: Any
    nodes: int
    worker: Hit | None
    gpus_per_node: int = 0
    tp: Any = None


def _model_path(bundle: Bundle) -> Any:
    """``--model-path`` (or ``--model``) as parsed, else the word after it in the command."""
    path = bundle.flag("model_path", "model", default=None)
    if path is None:
        command = list(bundle.facts.get("command") or [])
        for flag in ("--model", "--model-path"):
            if flag in command[:-1]:
                path = command[command.index(flag) + 1]
    return path


def _tp_as_given(bundle: Bundle) -> Any:
    """The TP size as parsed, else the word after ``--tensor-parallel-size`` (vLLM)."""
    tp = bundle.flag("tp_size", "tensor_parallel_size")
    command = list(bundle.facts.get("command") or [])
    if tp is None and "--tensor-parallel-size" in command[:-1]:
        tp = command[command.index("--tensor-parallel-size") + 1]
    return tp


def _missing_model(bundle: Bundle) -> MissingModel | None:
    hit = bundle.log.first(HF_MISSING)
    if hit is None:
        return None
    path = _model_path(bundle)
    nodes = int(bundle.facts.get("nodes_in_launch") or 1)
    worker = bundle.log.first(WORKER_IP)
    if nodes <= 1:
        return MissingModel(hit, path, nodes, worker)
    gpus = len((bundle.facts.get("node") or {}).get("gpus") or [])
    return MissingModel(hit, path, nodes, worker, gpus, _tp_as_given(bundle))


def model_not_found(bundle: Bundle) -> Diagnosis | None:
    """The model path does not resolve where a rank runs: a local path missing there is taken
    for a Hugging Face repo id (transformers ``utils/hub.py``, §6)."""
    found = _missing_model(bundle)
    return None if found is None else _missing_model_diagnosis(bundle, found)


CACHE_DIR = re.compile(r"Cache directory not found: (?P<dir>[^\s.]+(?:\.[^\s.]+)*)")
WORKER_EXIT = re.compile(r"died, exit code: (?P<code>-?\d+)")


def _missing_cache_diagnosis(bundle: Bundle, found: MissingModel) -> Diagnosis:
    """The Hugging Face cache folder is missing where the server runs: the volume that holds
    it is not mounted (or HF_HUB_CACHE points elsewhere); nothing was downloaded or read."""
    folder = bundle.log.first(CACHE_DIR)
    where = folder[1]["dir"] if folder else "the Hugging Face cache"
    tp = bundle.tp()
    numbers: dict[str, float] = {"tensor_parallel_size": tp}
    said = f"; TP {tp}"
    died = bundle.log.first(WORKER_EXIT)
    if died is not None:
        numbers["worker_exit_code"] = int(died[1]["code"])
        said += f", the workers were then stopped (exit code: {died[1]['code']})"
    return Diagnosis(
        category="model-not-found",
        summary=(
            f"model {found.path or '?'} cannot be found: the Hugging Face cache directory "
            f"{where} does not exist on the node (its volume not mounted, or HF_HUB_CACHE "
            f"pointing elsewhere){said}"
        ),
        remedy=(
            f"mount the HF cache volume at the path the server expects ({where}), point "
            "HF_HUB_CACHE at the mounted cache, or pass a local model path; check with "
            "test -d $HF_HUB_CACHE before launch"
        ),
        evidence=[bundle.evidence(found.hit)],
        numbers=numbers,
    )


def _missing_model_diagnosis(bundle: Bundle, found: MissingModel) -> Diagnosis:
    if "ache" in found.hit[1].group(0):
        return _missing_cache_diagnosis(bundle, found)
    numbers: dict[str, float] = {"nodes": found.nodes}
    where = ""
    if found.nodes > 1:
        if found.gpus_per_node:
            numbers["gpus_total"] = found.gpus_per_node * found.nodes
        if str(found.tp).isdigit():
            numbers["tensor_parallel_size"] = int(str(found.tp))
        where = f" on the worker of a {found.nodes}-node launch "
        where += f"({numbers.get('gpus_total', '?')} GPUs"
        where += f", tp {found.tp})" if found.tp is not None else ")"
        if found.worker is not None:
            where += f" at {found.worker[1]['ip']}"
    return Diagnosis(
        category="model-not-found",
        summary=(
            f"model path {found.path or '?'} does not resolve{where}; the missing local path was "
            "taken for a Hugging Face repo id and failed validation"
        ),
        remedy=(
            "use the same model path on every node (a shared filesystem, or copy/rsync the "
            "weights to each node); check with test -f <path>/config.json on all nodes"
        ),
        evidence=[bundle.evidence(found.hit)]
        + ([bundle.evidence(found.worker)] if found.worker else []),
        numbers=numbers,
    )


# Block-quantized (FP8) checkpoints store one scale per block_n × block_k tile: a rank's shard
# of a weight must be a whole number of tiles (sglang/vllm fp8 ``validate_block_quant_shapes``).
BLOCK_NOT_DIVISIBLE = re.compile(
    r"Weight (?P<what>output_partition_size|input_size_per_partition) = (?P<shard>\d+) is not "
    r"divisible by weight quantization (?P<block_name>block_[nk]) = (?P<block>\d+)"
)
#: config.json keys of the dimensions a shared expert or MLP splits over the TP ranks.
SHARDED_KEYS = (
    "share_expert_dim",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "intermediate_size",
)


def block_divisibility(bundle: Bundle) -> Diagnosis | None:
    """A TP shard of a block-quantized weight is not a multiple of the quantization block: the
    dimension / TP size must be divisible by the block size (128 for FP8 checkpoints)."""
    hit = bundle.log.first(BLOCK_NOT_DIVISIBLE)
    if hit is None:
        return None
    shard, block, tp = int(hit[1]["shard"]), int(hit[1]["block"]), bundle.tp()
    numbers: dict[str, float] = {"tp_size": tp, "shard_size": shard, "block_size": block}
    config = bundle.facts.get("model_config") or {}
    key = next((k for k in SHARDED_KEYS if isinstance(config.get(k), int) and k), None)
    dim = config[key] if key else shard * tp if tp > 1 else None
    whole = ""
    sizes: list[int] = []
    if dim:
        numbers[key or "sharded_dim"] = dim
        sizes = [t for t in (1, 2, 4, 8, 16, 32) if dim % t == 0 and (dim // t) % block == 0]
        whole = f"{key or 'the sharded dimension'} {dim} / TP {tp} = {shard} per rank, "
    fits = [t for t in sizes if t <= tp]
    best = max(fits) if fits else None
    if best is not None:
        numbers["suggested_tp_size"] = best
    flag = "--tensor-parallel-size" if bundle.vllm else "--tp-size"
    rule = f"{dim}/tp must be a multiple of {block}" if dim else f"dimension/tp % {block} == 0"
    return Diagnosis(
        category="tp-divisibility",
        summary=(
            f"TP {tp} shards a block-quantized weight into pieces the quantization block does "
            f"not divide: {whole}{hit[1]['what']} {shard} is not a multiple of "
            f"{hit[1]['block_name']} {block}"
            + (f"; TP sizes that work: {', '.join(map(str, sizes))}" if sizes else "")
        ),
        remedy=(
            f"use a tensor parallel size whose shard is a multiple of {block} ("
            + (f"{flag} {best}, " if best else "")
            + f"{rule}), and put further GPUs to data or pipeline parallelism "
            + (
                "(--data-parallel-size 2 or --pipeline-parallel-size 2)"
                if bundle.vllm
                else "(--dp)"
            )
            + "; or a BF16 checkpoint, which has no blocks"
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


#: The line that alone shows each rule's failure, whatever its figures say (engine._unreadable).
RECOGNISES: dict[Rule, tuple[str, re.Pattern[str]]] = {
    tp_divisibility: ("tp-divisibility", NOT_DIVISIBLE),
    block_divisibility: (
        "tp-divisibility",
        re.compile(r"is not divisible by weight quantization block"),
    ),
    model_not_found: ("model-not-found", HF_MISSING),
}
