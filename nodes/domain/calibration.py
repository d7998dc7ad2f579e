"""Calibration figures from an SGLang start-up log, per rank (shared/reference/sglang.md §3b):
``Load weight begin. avail mem=X GB`` (free memory before weights), ``Load weight end. … mem
usage=Y GB`` (weights), ``KV Cache is allocated. #tokens: N`` and rank 0's
``max_total_num_tokens=N``. SGLang prints these "GB" as GiB (÷ 2^30); they are kept as bytes.

A line's rank comes from its prefix ``[time DP0 TP3 EP3]`` (``TP`` tag; a single-GPU server
prints none and is rank 0). The server's figures are the ones SGLang itself uses: the least free
memory before load over the ranks (it all-reduces the minimum) and the most weights on a rank.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

GiB = 2**30
_RANK = re.compile(r"^\[[^\]]*?\bTP(\d+)\b[^\]]*\]")
_BEGIN = re.compile(r"Load weight begin\. avail mem=([\d.]+) GB")
#: ``Load weight end. …, mem usage=Y GB``: found as the text after the first ``_END_AT`` (a lazy
#: ``.*?`` from every occurrence would take time growing with the square of a pasted line).
_END_AT = "Load weight end."
_END = re.compile(r"mem usage=([\d.]+) GB")
_KV = re.compile(r"KV Cache is allocated\.(?: dtype: [^,]+,)? #tokens: (\d+)")
# SGLang prints its arguments once at start-up: ``server_args=ServerArgs(model_path='…', …,
# tp_size=4, …)`` (python/sglang/srt/server_args.py, dataclass repr). They are read from the text
# after the first ``_ARGS_AT`` of a line (see ``_server_args``).
_ARGS_AT = "server_args=ServerArgs("
_ARG_MODEL = re.compile(r"\bmodel_path='([^']*)'")
_ARG_TP = re.compile(r"\btp_size=(\d+)")
_MAX = re.compile(r"max_total_num_tokens=(-?\d+)")
#: The longest line read for figures: SGLang's are under 300 characters, its ``server_args``
#: under 20,000; a pasted log's longer lines are read this far, so one line costs bounded time.
LINE_MAX = 4096
ARGS_MAX = 65536
#: A line's rank prefix (``[time DP0 TP3 EP3]``) is within its first characters.
PREFIX_MAX = 200
#: The settings a device KV pool's size depends on beside the GPU and the weights (SGLang's
#: ``ModelRunner.profile_max_num_token``: the fraction of memory kept, the bytes per token's
#: cache, a cap on tokens), as ``server_args`` prints them. Token counts from a run with other
#: values are no measure of an estimate for these (fp8 holds twice the tokens of bf16).
POOL_SETTINGS = ("kv_cache_dtype", "mem_fraction_static", "max_total_tokens")
_ARG_SETTING = {name: re.compile(rf"\b{name}=('[^']*'|[\w.]+)") for name in POOL_SETTINGS}


def _server_args(line: str) -> str | None:
    """The text of a line after its first ``server_args=ServerArgs(`` (at most ``ARGS_MAX``
    characters), None when it has none."""
    at = line.find(_ARGS_AT)
    return None if at < 0 else line[at + len(_ARGS_AT) : at + len(_ARGS_AT) + ARGS_MAX]


def pool_settings_of(values: dict[str, Any]) -> dict[str, str]:
    """``POOL_SETTINGS`` as text from flag values by dest (``ParsedCommand.values``), SGLang's
    defaults where unset (``auto`` dtype, automatic fraction, no cap: ``None``)."""
    defaults = {"kv_cache_dtype": "auto", "mem_fraction_static": None, "max_total_tokens": None}
    return {name: str(values.get(name, defaults[name])) for name in POOL_SETTINGS}


def pool_settings_in(lines: Iterable[str]) -> dict[str, str] | None:
    """``POOL_SETTINGS`` as a log's ``server_args`` line prints them; None without that line."""
    for line in lines:
        args = _server_args(line)
        if args is None:
            continue
        found = {}
        for name, pattern in _ARG_SETTING.items():
            if (match := pattern.search(args)) is not None:
                found[name] = match[1].strip("'")
        return pool_settings_of(found)
    return None


def settings_differ(ran: dict[str, str], asked: dict[str, str]) -> str:
    """What differs between the settings a run had and a revision asks, as flags ("--kv-cache-
    dtype auto, this revision fp8_e5m2"); "" when none does."""
    return "; ".join(
        f"--{name.replace('_', '-')} {ran[name]}, this revision {asked[name]}"
        for name in POOL_SETTINGS
        if name in ran and name in asked and ran[name] != asked[name]
    )


class CalibrationError(ValueError):
    """The log holds no ``Load weight begin``/``end`` pair to calibrate from, or one of its
    figures is not a number that a GPU could print (the message says which)."""


@dataclass
class RankFigures:
    """What one rank logged; None where its line is missing."""

    rank: int
    free_before_load_bytes: int | None = None
    weights_bytes: int | None = None
    kv_tokens: int | None = None


@dataclass(frozen=True)
class Figures:
    """A server's calibration: the minimum free memory before load, the largest weights per
    rank, the device KV tokens (rank 0's ``max_total_num_tokens`` or the smallest KV line), and
    every rank's own figures."""

    free_before_load_bytes: int
    weights_per_rank_bytes: int
    kv_tokens: int | None
    ranks: tuple[RankFigures, ...]
    model_path: str | None = None  # as the log's server_args give them, when it has them
    tp_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["ranks"] = [asdict(r) for r in self.ranks]
        return doc


#: A GPU's memory figure above this is no reading (the largest cards hold under 300 GB).
MEMORY_MAX_BYTES = 2**40  # 1 TiB
#: A token count above this is no reading: SGLang indexes a pool's token slots with int32
#: (``ReqToTokenPool.req_to_token``, python/sglang/srt/mem_cache/memory_pool.py).
TOKENS_MAX = 2**31 - 1
_DECIMAL = re.compile(r"\d{1,15}(?:\.\d{1,15})?")


def _gib(text: str, what: str) -> int:
    """``text`` GiB (as SGLang prints "GB") in bytes; ``CalibrationError`` for anything that is
    not a plain decimal of at most ``MEMORY_MAX_BYTES``."""
    if not _DECIMAL.fullmatch(text) or float(text) * GiB > MEMORY_MAX_BYTES:
        raise CalibrationError(
            f"{what}={text[:40]} GB is not a GPU memory figure "
            f"(a decimal number of GB up to {MEMORY_MAX_BYTES // GiB:,})"
        )
    return round(float(text) * GiB)


def _tokens(text: str, what: str) -> int:
    """A token count; ``CalibrationError`` past ``TOKENS_MAX``."""
    if len(text) > 11 or abs(int(text)) > TOKENS_MAX:
        raise CalibrationError(f"{what}={text[:40]} is not a token count (at most {TOKENS_MAX:,})")
    return int(text)


def parse(lines: Iterable[str]) -> Figures:
    """The calibration figures of a start-up log; raises ``CalibrationError`` when the log does
    not show both weight lines of at least one rank, or when a figure is malformed or past what
    a GPU holds (``MEMORY_MAX_BYTES``, ``TOKENS_MAX``)."""
    ranks: dict[int, RankFigures] = {}
    max_total = model_path = tp_size = None
    for whole in lines:
        args = _server_args(whole)
        if args is not None and model_path is None and (arg := _ARG_MODEL.search(args)):
            model_path = arg.group(1)
        if args is not None and tp_size is None and (arg := _ARG_TP.search(args)):
            tp_size = _tokens(arg.group(1), "tp_size")
        line = whole[:LINE_MAX]
        found = _RANK.search(line[:PREFIX_MAX])
        rank = int(found.group(1)) if found else 0
        figures = ranks.setdefault(rank, RankFigures(rank))
        end = line.find(_END_AT)
        if match := _BEGIN.search(line):
            figures.free_before_load_bytes = _gib(match.group(1), "avail mem")
        elif end >= 0 and (match := _END.search(line, end)):
            figures.weights_bytes = _gib(match.group(1), "mem usage")
        elif match := _KV.search(line):
            figures.kv_tokens = _tokens(match.group(1), "#tokens")
        elif match := _MAX.search(line):
            # A pool of no tokens is no reading of one.
            max_total = _tokens(match.group(1), "max_total_num_tokens") or None
            max_total = max_total if max_total is None or max_total > 0 else None
    frees = [r.free_before_load_bytes for r in ranks.values() if r.free_before_load_bytes]
    weights = [r.weights_bytes for r in ranks.values() if r.weights_bytes]
    if not frees or not weights:
        raise CalibrationError(
            "the log has no 'Load weight begin. avail mem=' and 'Load weight end. … mem usage=' "
            "lines to calibrate from"
        )
    kv = [r.kv_tokens for r in ranks.values() if r.kv_tokens is not None]
    tokens = max_total if max_total is not None else (min(kv) if kv else None)
    kept = tuple(r for _, r in sorted(ranks.items()) if r != RankFigures(r.rank))
    return Figures(min(frees), max(weights), tokens, kept, model_path, tp_size)


def check_fits(figures: Figures, model_path: str, tp: int) -> None:
    """Raise ``CalibrationError`` when the log's own arguments say it is of another model
    (another folder name) or another TP size than the estimate it would calibrate: weights per
    rank of one are no figure for the other. A log without ``server_args`` is taken as given."""
    if figures.tp_size is not None and figures.tp_size != tp:
        raise CalibrationError(f"the log is of a server at TP{figures.tp_size}, not TP{tp}")
    if beyond := [r.rank for r in figures.ranks if r.rank >= max(1, tp)]:
        raise CalibrationError(f"the log names rank TP{beyond[0]}, which a TP{tp} server has not")
    if figures.model_path and model_path:
        theirs, ours = (
            p.rstrip("/").rsplit("/", 1)[-1].lower() for p in (figures.model_path, model_path)
        )
        if theirs != ours:
            raise CalibrationError(
                f"the log is of {figures.model_path}, not {model_path} (folder names differ)"
            )


#: Weights one rank loads against the checkpoint's share of it (its tensors over TP × PP ranks):
#: from about a quarter (a 16-bit checkpoint quantized to 4 bits while loading; fp8 on load
#: halves it, as ``--quantization fp8`` does) to well under twice (layers every rank holds whole:
#: norms, replicated attention under DP attention). Outside these, the log is of another model.
WEIGHTS_SHARE_RANGE = (0.2, 2.0)


def check_plausible(
    figures: Figures,
    *,
    checkpoint_bytes: int | None,
    ranks: int,
    gpu_memory_bytes: int | None,
) -> list[str]:
    """Raise ``CalibrationError`` when the figures cannot be of this model on this GPU: more free
    memory before the weights than the GPU has, weights larger than the memory they loaded into,
    or weights per rank outside ``WEIGHTS_SHARE_RANGE`` of the checkpoint's share (its tensors'
    bytes, as the safetensors headers give them, over ``ranks``). Returns what could not be
    checked, in words (no checkpoint size known, no GPU size known)."""
    unchecked = []
    free, weights = figures.free_before_load_bytes, figures.weights_per_rank_bytes
    if gpu_memory_bytes:
        if free > gpu_memory_bytes:
            raise CalibrationError(
                f"the log says {free / GiB:.2f} GiB were free before the weights, more than the "
                f"{gpu_memory_bytes / GiB:.2f} GiB the GPU has"
            )
    else:
        unchecked.append("the GPU's memory is not known")
    if weights > free:
        raise CalibrationError(
            f"the log says {weights / GiB:.2f} GiB of weights per rank loaded into "
            f"{free / GiB:.2f} GiB of free memory, which cannot hold them"
        )
    if not checkpoint_bytes or ranks < 1:
        unchecked.append("the checkpoint's size is not known")
        return unchecked
    share = checkpoint_bytes / ranks
    low, high = WEIGHTS_SHARE_RANGE
    if not low * share <= weights <= high * share:
        raise CalibrationError(
            f"the log says {weights / GiB:.2f} GiB of weights per rank, but the checkpoint's "
            f"tensors are {checkpoint_bytes / GiB:.2f} GiB, {share / GiB:.2f} GiB per rank over "
            f"{ranks} rank{'s' if ranks != 1 else ''}: a start-up of this model loads between "
            f"{low:g} and {high:g} times that, not {weights / share:.3g} times"
        )
    return unchecked
