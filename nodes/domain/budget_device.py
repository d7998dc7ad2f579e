"""The device KV pool of one rank, in SGLang's order (shared/reference/sglang.md §3, §3b): the
KV bytes per token, the free memory before the weights and the weights per rank (observed, or
estimated), the rest for the KV cache (``avail after weights − free before weights × (1 −
mem-fraction-static)``), the state and sliding-window pools' shares of it, ÷ the KV bytes per
token, capped by ``--max-total-tokens``, rounded down to pages; then the headroom left for
activations and CUDA graphs. All sizes are bytes.

Each step's arithmetic is a function returning its figures; the lines and messages that show
them are written into the ``BudgetReport`` by the step that uses them (``device_pool``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nodes.domain.budget_types import BudgetReport, NodeMemory, Observed
from nodes.domain.checkpoint import HeaderError
from nodes.domain.checkpoint import per_rank as from_headers
from nodes.domain.geometry import ModelGeometry, kv_bytes_per_token, kv_elem_bytes
from nodes.domain.gpu_overhead import overhead_bytes
from nodes.domain.sglang_flags import ParsedCommand
from nodes.domain.units import GiB, format_bytes
from nodes.domain.weights import per_rank as weights_per_rank

#: --mamba-full-memory-ratio and --swa-full-tokens-ratio defaults (0.5.9 flag table).
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8


def default_mem_fraction(gpu_bytes: int, tp: int, pp: int) -> float:
    """SGLang's default mem-fraction-static (§1c, ``server_args.py`` @0.5.2)."""
    gpu = gpu_bytes / GiB
    if gpu < 35:
        reserve = 2.8 + tp * pp / 10
    elif gpu < 90:
        reserve = 9.5 + tp * pp / 2
    elif gpu < 160:
        reserve = 12 + tp * pp / 2
    else:
        reserve = 32
    return round((gpu - reserve) / gpu, 3)


@dataclass(frozen=True)
class DevicePool:
    """One rank's device KV pool as the budget found it: ``tokens`` and ``kv_bytes`` (``None``:
    not estimated), the KV bytes per token (``cell``), and the free GPU memory before the
    weights (``pre``) and the weights per rank it was sized from (``None`` when not sized)."""

    tokens: int | None
    kv_bytes: int | None
    cell: int | None
    pre: int | None = None
    weights: int | None = None


@dataclass(frozen=True)
class Parallel:
    """The command's TP and PP sizes, attention TP (tp ÷ attention-DP size under DP attention:
    each attention-DP rank keeps its own requests' KV) and ``--kv-cache-dtype``."""

    tp: int
    pp: int
    attention_tp: int
    dtype: str


def parallel_of(flags: ParsedCommand) -> Parallel:
    """``Parallel`` from the command's flags (each size 1 when not given)."""
    tp = int(flags.get("tp_size", "tensor_parallel_size", default=1))
    pp = int(flags.get("pp_size", "pipeline_parallel_size", default=1))
    dtype = str(flags.get("kv_cache_dtype", default="auto"))
    dp = int(flags.get("dp_size", "data_parallel_size", default=1))
    attn_dp = int(flags.get("attn_dp_size", default=1) or 1)
    if flags.get("enable_dp_attention", default=False) and dp > 1:
        attn_dp = dp
    attention_tp = max(1, tp // attn_dp) if attn_dp > 1 else tp
    return Parallel(tp, pp, attention_tp, dtype)


def device_pool(
    flags: ParsedCommand,
    node: NodeMemory,
    geometry: ModelGeometry | None,
    weights_bytes: int | None,
    report: BudgetReport,
    observed: Observed,
) -> DevicePool:
    """Size one rank's device KV pool, writing each step's arithmetic into ``report``.

    Needs the model's ``geometry`` (else the pool is reported unknown) and the checkpoint size
    ``weights_bytes`` unless ``observed`` gives the weights per rank (bytes). A layout the
    engine does not know is refused with the reason, never guessed; like ``check``, a bad
    profile is reported, not raised.
    """
    parallel = parallel_of(flags)
    cell = _kv_cell(geometry, parallel)
    if geometry is not None and cell is not None:
        report.lines.append(_cell_line(geometry, cell, parallel.dtype))
    pre, weights = load_figures(flags, node, geometry, weights_bytes, report, observed, parallel)
    if geometry is not None and geometry.unknown_layout is not None:
        report.add(
            "warn",
            "estimate_unavailable",
            f"estimate unavailable: {geometry.unknown_layout}. The device KV pool is not "
            "estimated rather than guessed; a launch's own 'KV Cache is allocated' line gives it.",
        )
        return DevicePool(None, None, None, pre, weights)
    if not node.gpu_memory_bytes or geometry is None or pre is None or weights is None or not cell:
        report.add(
            "info",
            "device_unknown",
            "Device pool not estimated: the model's config.json and checkpoint size are needed",
        )
        return DevicePool(None, None, cell)
    return _sized_pool(flags, node, geometry, cell, pre, weights, parallel, report)


def _kv_cell(geometry: ModelGeometry | None, parallel: Parallel) -> int | None:
    """KV bytes per token on one rank (``geometry.kv_bytes_per_token``); ``None`` without a
    geometry or for a layout the engine does not know."""
    if geometry is None or geometry.unknown_layout is not None:
        return None
    elem = kv_elem_bytes(parallel.dtype, geometry.torch_dtype)
    return kv_bytes_per_token(geometry, parallel.attention_tp, parallel.pp, elem)


def _cell_line(geometry: ModelGeometry, cell: int, dtype: str) -> str:
    kind = (
        "MLA latent, replicated on every rank" if geometry.is_mla else "K and V heads of this rank"
    )
    if geometry.index_head_dim:
        kind += ", plus the DSA indexer's fp8 keys"
    if geometry.attention_layers is not None:
        kind += f"; {geometry.attention_layers} of {geometry.layers} layers keep KV"
    return f"KV bytes per token per rank: {cell:,} ({kind}, kv-cache-dtype {dtype})"


def _sized_pool(
    flags: ParsedCommand,
    node: NodeMemory,
    geometry: ModelGeometry,
    cell: int,
    pre: int,
    weights: int,
    parallel: Parallel,
    report: BudgetReport,
) -> DevicePool:
    """The pool from the free memory before the weights and the weights per rank, in SGLang's
    order: the rest, its split between the pools, the token cap, the pages; then the headroom."""
    total = min(node.gpu_memory_bytes)
    rest = rest_for_kv(pre, weights, _mem_fraction(flags, total, parallel))
    report.lines.append(_rest_line(rest))
    if rest.rest <= 0:
        _no_kv_room(rest, report)
        return DevicePool(0, 0, cell, pre, weights)
    tokens = _split(flags, geometry, rest.rest, cell, report)
    if tokens is None:
        return DevicePool(None, None, cell, pre, weights)
    tokens = _capped(flags, tokens, report)
    kv = tokens * cell
    report.device_kv_tokens_per_rank = tokens
    report.device_kv_bytes_per_rank = kv
    report.lines.append(
        f"Device KV pool per rank: {tokens:,} tokens ({format_bytes(kv, places=2)})"
    )
    _headroom(rest.reserve, headroom_reference(total, parallel), report)
    return DevicePool(tokens, kv, cell, pre, weights)


def _mem_fraction(flags: ParsedCommand, total: int, parallel: Parallel) -> float:
    """``--mem-fraction-static``, else SGLang's default for a card of ``total`` bytes."""
    given = flags.get("mem_fraction_static")
    return (
        float(given) if given is not None else default_mem_fraction(total, parallel.tp, parallel.pp)
    )


@dataclass(frozen=True)
class Figure:
    """A figure the pool is sized from (bytes; ``None`` unknown), where it came from (``kind``:
    ``observed``, ``calibrated`` or ``estimate``; ``None`` unknown) and the lines showing it."""

    value: int | None
    kind: str | None
    lines: tuple[str, ...] = ()


def load_figures(
    flags: ParsedCommand,
    node: NodeMemory,
    geometry: ModelGeometry | None,
    weights_bytes: int | None,
    report: BudgetReport,
    observed: Observed,
    parallel: Parallel,
) -> tuple[int | None, int | None]:
    """Free memory before load and weights per rank, bytes: observed where given, else estimated;
    shown in ``report`` with where they came from (``report.calibration``)."""
    free = _free_before_load(flags, node, observed, parallel)
    report.lines.extend(free.lines)
    try:
        weights = _weights_per_rank(geometry, weights_bytes, observed, parallel)
    except HeaderError as exc:
        assert geometry is not None  # only a checkpoint's headers raise it
        unread = replace(geometry, tensors=None, headers_note=f"headers unusable: {exc}")
        # From the checkpoint size instead; the free memory is shown again, as it always was.
        return load_figures(flags, node, unread, weights_bytes, report, observed, parallel)
    report.lines.extend(weights.lines)
    report.free_before_load_bytes = free.value
    report.weights_bytes_per_rank = weights.value
    report.calibration = _calibration(free.kind, weights.kind, observed)
    return free.value, weights.value


@dataclass(frozen=True)
class FreeEstimate:
    """Free GPU memory before the weights, estimated: the smallest card (``total``), less what
    the fullest of the least-used GPUs the ranks take holds (``used``), less the CUDA context
    and NCCL (``overhead``, ``nodes.domain.gpu_overhead``)."""

    total: int
    used: int
    overhead: int

    @property
    def free(self) -> int:
        return self.total - self.used - self.overhead


def estimate_free(flags: ParsedCommand, node: NodeMemory, parallel: Parallel) -> FreeEstimate:
    """``FreeEstimate`` for a node with at least one GPU."""
    total = min(node.gpu_memory_bytes)
    # The ranks take the least-used GPUs; the fullest of those bounds every rank's pool.
    busy = sorted(node.gpu_used_bytes or (0,))
    used = busy[min(len(busy), max(1, parallel.tp * parallel.pp)) - 1]
    name = node.gpu_names[0] if node.gpu_names else None
    custom_all_reduce = not flags.get("disable_custom_all_reduce", default=False)
    overhead = overhead_bytes(name, parallel.tp, custom_all_reduce=custom_all_reduce)
    return FreeEstimate(total, used, overhead)


def _free_before_load(
    flags: ParsedCommand, node: NodeMemory, observed: Observed, parallel: Parallel
) -> Figure:
    pre = observed.free_before_load_bytes
    if pre is not None:
        line = f"Free GPU memory before weights: {format_bytes(pre, places=2)} ({observed.label})"
        return Figure(pre, observed.kind, (line,))
    if not node.gpu_memory_bytes:
        return Figure(None, None)
    estimate = estimate_free(flags, node, parallel)
    line = (
        f"Free GPU memory before weights: {format_bytes(estimate.total)} − "
        f"{format_bytes(estimate.used)} used − {format_bytes(estimate.overhead, places=2)} CUDA "
        f"context and NCCL (estimated) = {format_bytes(estimate.free, places=2)}"
    )
    return Figure(estimate.free, "estimate", (line,))


def _weights_per_rank(
    geometry: ModelGeometry | None,
    weights_bytes: int | None,
    observed: Observed,
    parallel: Parallel,
) -> Figure:
    """Observed, else from the safetensors headers (raises ``HeaderError`` for unusable ones),
    else from the checkpoint size and config.json (``nodes.domain.weights``)."""
    tp, pp = parallel.tp, parallel.pp
    weights = observed.weights_per_rank_bytes
    if weights is not None:
        line = f"Weights per rank: {format_bytes(weights, places=2)} ({observed.label})"
        return Figure(weights, observed.kind, (line,))
    if geometry is not None and geometry.tensors is not None:
        estimate = from_headers(geometry.tensors, geometry.config, tp, pp)
        head = "Weights per rank (from the checkpoint's safetensors headers):"
        return Figure(estimate.bytes_per_rank, "estimate", _shown(head, estimate.lines))
    if weights_bytes is not None and weights_bytes >= 0:
        config = geometry.config if geometry is not None else None
        estimate = weights_per_rank(weights_bytes, config, tp, pp)
        why = f"; {geometry.headers_note}" if geometry is not None and geometry.headers_note else ""
        head = (
            "Weights per rank (estimated from the checkpoint size and config.json, not from "
            f"safetensors headers{why}):"
        )
        return Figure(estimate.bytes_per_rank, "estimate", _shown(head, estimate.lines))
    return Figure(None, None)


def _shown(head: str, lines: tuple[str, ...]) -> tuple[str, ...]:
    return (head, *(f"  {line}" for line in lines))


def _calibration(
    free_kind: str | None, weights_kind: str | None, observed: Observed
) -> dict[str, str]:
    """``BudgetReport.calibration`` from where the two figures came from (``None``: unknown)."""
    kinds = {free_kind, weights_kind} - {None}
    if kinds <= {"estimate"}:
        source, label = "estimate", "estimated"
    elif kinds == {observed.kind}:
        source, label = observed.kind, observed.label
    else:
        source, label = "partly observed", observed.label
    return {
        "source": source,
        "label": label,
        "free_before_load": free_kind if free_kind is not None else "unknown",
        "weights": weights_kind if weights_kind is not None else "unknown",
    }


@dataclass(frozen=True)
class Rest:
    """SGLang's rest for the KV cache (§3): of the free memory before the weights (``pre``),
    what the weights leave (``after``) less what mem-fraction-static keeps back for activations
    and CUDA graphs (``reserve`` = pre × (1 − mfs))."""

    pre: int
    weights: int
    mfs: float
    after: int
    reserve: int
    rest: int

    @property
    def needed_mfs(self) -> float:
        """The fraction whose static pool holds the weights with 0.05 of the free memory to
        spare, rounded to 0.01."""
        return round(self.weights / self.pre + 0.05, 2)


def rest_for_kv(pre: int, weights: int, mfs: float) -> Rest:
    """``Rest`` from the free memory before the weights and the weights per rank (bytes) at
    mem-fraction-static ``mfs``; negative or zero when the weights leave no room."""
    after = pre - weights
    reserve = int(pre * (1 - mfs))
    return Rest(pre, weights, mfs, after, reserve, after - reserve)


def _rest_line(rest: Rest) -> str:
    return (
        f"Rest for the KV cache: {format_bytes(rest.after, places=2)} free after weights − "
        f"{format_bytes(rest.pre, places=2)} × (1 − mem-fraction-static {rest.mfs}) = "
        f"{format_bytes(rest.rest, places=2)}"
    )


def _no_kv_room(rest: Rest, report: BudgetReport) -> None:
    """Block: the weights fill the static pool; suggest a fraction when one up to 0.95 holds
    them, else more GPUs."""
    needed = rest.needed_mfs
    if needed <= 0.95:
        fix = f"Raise --mem-fraction-static to about {needed}, or spread the model over more GPUs."
        report.suggestion = {"--mem-fraction-static": needed}
    else:
        fix = (
            "The weights do not fit these GPUs at this TP size: use more GPUs (a larger --tp-size)."
        )
    report.add(
        "block",
        "no_kv_room",
        f"The weights ({format_bytes(rest.weights, places=2)} per rank) fill the static pool "
        f"({format_bytes(int(rest.pre * rest.mfs), places=2)}): no room for the KV cache. {fix}",
    )


def _split(
    flags: ParsedCommand,
    geometry: ModelGeometry,
    rest: int,
    cell: int,
    report: BudgetReport,
) -> int | None:
    """Device tokens from the rest, after SGLang's state and sliding-window splits.

    Hybrid state models (``model_runner.handle_max_mamba_cache``): unless
    ``--max-mamba-cache-size`` is given, the state pool takes ratio / (1 + ratio) of the rest
    (``--mamba-full-memory-ratio``, default 0.9; kv-observations K28: 4.48 + 5.00 GiB of 9.49).
    Sliding-window models: full and SWA layers share the rest so that the SWA pool holds
    ``--swa-full-tokens-ratio`` (default 0.8) × the full pool's tokens (K02: 300,288 of
    375,360); the full pool's count is the server's ``max_total_num_tokens``. ``None`` when
    the state pool's size cannot be known.
    """
    if geometry.is_hybrid:
        kv_rest = _after_state_pool(flags, geometry, rest, report)
        if kv_rest is None:
            return None
        rest = kv_rest
    if geometry.swa_layers and not flags.get("disable_hybrid_swa_memory", default=False):
        return _swa_tokens(flags, geometry, rest, cell, report)
    tokens = rest // cell
    report.lines.append(f"  {format_bytes(rest, places=2)} ÷ {cell:,} B = {tokens:,} tokens")
    return tokens


def state_pool_bytes(rest: int, ratio: float) -> int:
    """What the state pool takes of the rest: ratio / (1 + ratio) of it."""
    return int(rest * ratio / (1 + ratio))


def _after_state_pool(
    flags: ParsedCommand, geometry: ModelGeometry, rest: int, report: BudgetReport
) -> int | None:
    """The rest left for KV after a hybrid model's state pool; ``None`` (warned) when
    ``--max-mamba-cache-size`` fixes the state pool in requests of unknown size."""
    ratio = float(flags.get("mamba_full_memory_ratio", default=DEFAULT_MAMBA_FULL_MEMORY_RATIO))
    if flags.get("max_mamba_cache_size") is not None:
        report.add(
            "warn",
            "estimate_unavailable",
            "estimate unavailable: --max-mamba-cache-size fixes the state pool in requests, "
            "and the engine does not know this model's state bytes per request",
        )
        return None
    state = state_pool_bytes(rest, ratio)
    report.lines.append(
        f"  state pool ({geometry.state_layers} linear-attention/Mamba layers): "
        f"ratio {ratio} / (1 + {ratio}) of the rest = {format_bytes(state, places=2)}; "
        f"the KV pool gets {format_bytes(rest - state, places=2)}"
    )
    return rest - state


def swa_full_tokens(geometry: ModelGeometry, rest: int, cell: int, ratio: float) -> int:
    """Tokens of the full pool when full and sliding-window layers share ``rest`` and the SWA
    pool holds ``ratio`` × as many tokens; ``cell`` is the bytes per token of all KV layers."""
    attention = geometry.attention_layers or geometry.layers
    per_layer = cell / attention
    full_layers = attention - geometry.swa_layers
    return int(rest / (per_layer * (ratio * geometry.swa_layers + full_layers)))


def _swa_tokens(
    flags: ParsedCommand, geometry: ModelGeometry, rest: int, cell: int, report: BudgetReport
) -> int:
    ratio = float(flags.get("swa_full_tokens_ratio", default=DEFAULT_SWA_FULL_TOKENS_RATIO))
    tokens = swa_full_tokens(geometry, rest, cell, ratio)
    full_layers = (geometry.attention_layers or geometry.layers) - geometry.swa_layers
    report.lines.append(
        f"  {full_layers} full and {geometry.swa_layers} sliding-window layers: full pool "
        f"{tokens:,} tokens, SWA pool {int(tokens * ratio):,} (--swa-full-tokens-ratio "
        f"{ratio})"
    )
    return tokens


def _capped(flags: ParsedCommand, tokens: int, report: BudgetReport) -> int:
    """Tokens capped by ``--max-total-tokens``, then rounded down to whole pages."""
    cap = flags.get("max_total_tokens")
    if cap is not None and int(cap) < tokens:
        report.lines.append(f"  capped by --max-total-tokens {int(cap):,}")
        tokens = int(cap)
    page = int(flags.get("page_size", default=1) or 1)
    if page > 1:
        tokens = tokens // page * page
        report.lines.append(f"  rounded down to pages of {page}: {tokens:,} tokens")
    return tokens


def headroom_reference(total: int, parallel: Parallel) -> int:
    """What SGLang's default mem-fraction-static leaves outside the static pool on a card of
    ``total`` bytes."""
    return int((1 - default_mem_fraction(total, parallel.tp, parallel.pp)) * total)


def _headroom(headroom: int, reference: int, report: BudgetReport) -> None:
    """Show the headroom for activations and CUDA graphs; warn below half the default's."""
    report.lines.append(
        f"Headroom for activations and CUDA graphs: {format_bytes(headroom, places=2)} "
        f"(SGLang's default leaves {format_bytes(reference, places=2)} on this GPU)"
    )
    if headroom < reference // 2:
        report.add(
            "warn",
            "low_headroom",
            f"Only {format_bytes(headroom, places=2)} per GPU is left for activations and CUDA "
            f"graphs (SGLang's default keeps {format_bytes(reference, places=2)}): CUDA-graph "
            "capture or the first large batch may run out of GPU memory.",
        )
