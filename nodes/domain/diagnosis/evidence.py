"""What the rules read and what they return: the launch log, the bundle (log, facts, flags),
the evidence and the diagnosis; with the log formats and number helpers every rule shares."""

from __future__ import annotations

import ast
import bisect
import functools
import itertools
import math
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from nodes.domain.diagnosis.plain_words import asserted

GiB = 2**30
#: vLLM's --gpu-memory-utilization when the command does not set it (vllm/config/cache.py).
VLLM_DEFAULT_UTILIZATION = 0.9

#: One line a pattern found: its 1-based number in the log and the match (``Log.find``).
Hit = tuple[int, re.Match[str]]


@dataclass(frozen=True)
class Evidence:
    """A log line (1-based ``line``) or a snapshot fact (``line`` is ``None``)."""

    text: str
    line: int | None = None
    source: str = "log"


@dataclass
class Diagnosis:
    category: str
    summary: str
    remedy: str
    evidence: list[Evidence] = field(default_factory=list)
    numbers: dict[str, float] = field(default_factory=dict)
    secondary_categories: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """``{"category", "secondary_categories", "summary", "evidence", "remedy", "numbers"}``."""
        return {
            "category": self.category,
            "secondary_categories": list(self.secondary_categories),
            "summary": self.summary,
            "evidence": [asdict(e) for e in self.evidence],
            "remedy": self.remedy,
            # A figure no JSON reader takes (an absurd number in the log) is left out.
            "numbers": {
                k: v
                for k, v in self.numbers.items()
                if not (isinstance(v, float) and not math.isfinite(v))
            },
        }


class Log:
    """The launch log, searchable by pattern, with 1-based line numbers."""

    #: Longer lines are cut: no message a rule reads is longer, and regexes stay linear.
    MAX_LINE = 4096

    def __init__(self, text: str, nodes: Iterable[str] = ()) -> None:
        """``nodes``: the names of a multi-node launch's nodes, whose lines in its one log begin
        ``[NAME] `` (FORMAT.md's multi-node bundle): the tag is taken off each line (rules read
        what the node printed) and kept as the line's ``origin``."""
        self.source = text
        raw = text.splitlines()
        names = {n for n in nodes if n}
        self.origin: list[str] = [""] * len(raw)
        if names:
            alternatives = "|".join(map(re.escape, sorted(names)))
            tagged = re.compile(rf"\[({alternatives})\] ?")
            for index, match in enumerate(map(tagged.match, raw)):
                if match is not None:
                    self.origin[index] = match[1]
                    raw[index] = raw[index][match.end() :]
        self.lines = [line[: self.MAX_LINE] for line in raw]
        self._text = "\n".join(self.lines)
        self._found: dict[re.Pattern[str], list[tuple[int, re.Match[str]]]] = {}
        self._at: dict[str, list[int]] = {}
        self._shape_index: tuple[str, list[int], list[list[int]] | None] | None = None

    def find(self, pattern: str | re.Pattern[str]) -> list[tuple[int, re.Match[str]]]:
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        if regex not in self._found:
            self._found[regex] = self._search(regex)
        return self._found[regex]

    def _search(self, regex: re.Pattern[str]) -> list[tuple[int, re.Match[str]]]:
        # Most signatures are absent from most logs: a literal every match must contain is
        # looked for first (a substring search, far faster than the regex on a long log), and
        # the regex runs only on the lines that hold one.
        needles = needles_of(regex)
        if needles is None:
            numbers: Iterable[int] = range(len(self.lines))
        else:
            numbers = sorted({i for n in needles for i in self._lines_with(n)})
        found = []
        for index in numbers:
            match = regex.search(self.lines[index])
            if match:
                found.append((index + 1, match))
        return found

    def _lines_with(self, needle: str) -> list[int]:
        """The 0-based indexes of the lines holding ``needle``; remembered, as patterns share
        literals. A needle never spans lines (none holds a line break)."""
        if needle not in self._at:
            text, starts, lines_of = self._shapes()
            key = needle if lines_of is None else needle.translate(_DIGITS_TO_ZERO)
            at: list[int] = []
            where = text.find(key)
            while where != -1:
                row = bisect.bisect_right(starts, where) - 1
                if lines_of is None:
                    at.append(row)
                else:
                    at += (i for i in lines_of[row] if needle in self.lines[i])
                # Go on after this row: each is searched once.
                where = text.find(key, starts[row + 1] if row + 1 < len(starts) else len(text))
            self._at[needle] = at
        return self._at[needle]

    #: Lines sampled to decide whether the shape index pays, and the share of distinct shapes
    #: above which it does not (each line its own shape: the plain text is searched instead).
    SHAPE_SAMPLE = 20_000
    SHAPE_DISTINCT_MAX = 0.5

    def _shapes(self) -> tuple[str, list[int], list[list[int]] | None]:
        """What needles are looked for in: the log's distinct line *shapes* (each digit read as
        0: a long log repeats a few status lines with other figures), joined, with each one's
        offset and its lines; or, for a log whose lines rarely repeat a shape, the log itself
        with each line's offset (and ``None``)."""
        if self._shape_index is None:
            sample = self.lines[: self.SHAPE_SAMPLE]
            shaped_sample = {line.translate(_DIGITS_TO_ZERO) for line in sample}
            if len(shaped_sample) > self.SHAPE_DISTINCT_MAX * max(len(sample), 1):
                starts = [0, *itertools.accumulate(len(x) + 1 for x in self.lines[:-1])]
                self._shape_index = (self._text, starts, None)
                return self._shape_index
            by_shape: dict[str, list[int]] = {}
            shaped = self._text.translate(_DIGITS_TO_ZERO).split("\n")
            for index, shape in enumerate(shaped):
                by_shape.setdefault(shape, []).append(index)
            shapes = list(by_shape)
            starts = [0, *itertools.accumulate(len(x) + 1 for x in shapes[:-1])]
            self._shape_index = ("\n".join(shapes), starts, list(by_shape.values()))
        return self._shape_index

    def first(self, pattern: str | re.Pattern[str]) -> tuple[int, re.Match[str]] | None:
        hits = self.find(pattern)
        return hits[0] if hits else None

    def node(self, number: int) -> str:
        """The node that printed line ``number`` (1-based) of a multi-node log; ``""`` when the
        line carries no node tag."""
        return self.origin[number - 1] if 0 < number <= len(self.origin) else ""


_DIGITS_TO_ZERO = str.maketrans("123456789", "000000000")


SPECIAL = set(".^$*+?{}[]()|\\")
QUANTIFIERS = ("*", "?", "{")
ESCAPED_LITERALS = set(".^$*+?{}[]()|\\-/:'\" #%,;=<>!@&~`")


@functools.cache
def needles_of(regex: re.Pattern[str]) -> tuple[str, ...] | None:
    """Literal text every match of ``regex`` contains, read from its source: for each branch of
    a top-level ``|``, its longest run of literal characters (3 or more) outside groups and
    classes and not made optional by a quantifier. A match contains one of them; ``None`` when
    some branch has no such run."""
    if regex.flags & (re.IGNORECASE | re.VERBOSE):
        return None
    found = []
    for branch in _branches(regex.pattern):
        runs, run, depth, i = [], "", 0, 0
        while i < len(branch):
            char, literal = branch[i], None
            if char == "\\" and i + 1 < len(branch):
                literal = branch[i + 1] if branch[i + 1] in ESCAPED_LITERALS and not depth else None
                i += 2
            elif char == "[":
                i = _class_end(branch, i)
            else:
                depth += {"(": 1, ")": -1}.get(char, 0)
                literal = char if char not in SPECIAL and not depth else None
                i += 1
            if literal is not None and branch[i : i + 1] not in QUANTIFIERS:
                run += literal
                continue
            runs.append(run)
            run = ""
        best = max([*runs, run], key=len)
        if len(best) < 3:
            return None
        found.append(best)
    return tuple(found)


def _branches(source: str) -> list[str]:
    """``source`` split at its top-level ``|`` (not inside groups or classes, not escaped)."""
    parts, start, depth, i = [], 0, 0, 0
    while i < len(source):
        char = source[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            i = _class_end(source, i)
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "|" and not depth:
            parts.append(source[start:i])
            start = i + 1
        i += 1
    return [*parts, source[start:]]


def _class_end(source: str, start: int) -> int:
    """The index after the ``]`` that closes the character class opened at ``start``."""
    i = start + 1
    if source[i : i + 1] == "^":
        i += 1
    if source[i : i + 1] == "]":
        i += 1  # a ``]`` first in a class is a member
    while i < len(source):
        if source[i] == "\\":
            i += 2
        elif source[i] == "]":
            return i + 1
        else:
            i += 1
    return len(source)


@functools.cache
def _engine_arg(name: str) -> re.Pattern[str]:
    return re.compile(rf"\b{name}['\"]?(?:=|: | \()['\"]?(?P<value>[\w.+-]+)")


@dataclass
class Bundle:
    """What a rule reads: the log, the facts document, and the command's flags by dest."""

    log: Log
    facts: Mapping[str, Any]
    flags: Mapping[str, Any]

    def evidence(self, hit: tuple[int, re.Match[str]]) -> Evidence:
        """The line of ``hit``, with its node's tag on a multi-node log (where it came from)."""
        number, _ = hit
        node = self.log.node(number)
        text = self.log.lines[number - 1].strip()
        return Evidence((f"[{node}] {text}" if node else text)[:500], number)

    @cached_property
    def group(self) -> tuple[GroupNode, ...]:
        """The nodes of a multi-node launch in node-rank order (``extra.group``); ``()`` on one
        node or when the bundle does not list them."""
        return group_of(self.facts)

    def flag(self, *dests: str, default: Any = None) -> Any:
        for dest in dests:
            value = self.flags.get(dest)
            if value is not None:
                return value
        return default

    def cuda_visible(self) -> list[str]:
        """The entries of the launch's ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs); ``[]``
        when it is unset or empty."""
        visible = str((self.facts.get("env") or {}).get("CUDA_VISIBLE_DEVICES") or "")
        return [v.strip() for v in visible.split(",") if v.strip()]

    def gpu_named(self, cuda_index: Any) -> str:
        """A CUDA device index (as PyTorch's messages print it) in the node's words: ``GPU 3``,
        or ``CUDA device 0 (GPU 4 of the node)`` where ``CUDA_VISIBLE_DEVICES`` renumbers."""
        listed = self.cuda_visible()
        try:
            physical = listed[int(cuda_index)]
        except (ValueError, TypeError, IndexError):
            return f"GPU {cuda_index}"
        if physical == str(cuda_index):
            return f"GPU {cuda_index}"
        return f"CUDA device {cuda_index} (GPU {physical} of the node)"

    def node_gpus(self) -> int:
        """The GPUs ``facts.node`` lists; 0 when it lists none."""
        return len((self.facts.get("node") or {}).get("gpus") or [])

    def visible_gpus(self) -> int:
        """The GPUs the launch could use: ``CUDA_VISIBLE_DEVICES``'s entries, else the node's;
        0 when neither is known."""
        return len(self.cuda_visible()) or self.node_gpus()

    def host_ram_gb(self) -> float | None:
        ram = (self.facts.get("node") or {}).get("host_ram_bytes")
        return ram / 1e9 if isinstance(ram, int | float) and ram > 0 else None

    @cached_property
    def server_args(self) -> dict[str, Any]:
        """The values of the last ``server_args=ServerArgs(...)`` line: what SGLang resolved for
        the attempt the log ends with (automatic values included)."""
        hits = self.log.find(SERVER_ARGS)
        values: dict[str, Any] = {}
        for match in SERVER_ARG.finditer(hits[-1][1]["args"] if hits else ""):
            try:
                values[match["key"]] = ast.literal_eval(match["value"].strip())
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                values[match["key"]] = match["value"].strip()
        return values

    def setting(self, *dests: str) -> Any:
        """A setting from the parsed command, else from the log's ``server_args`` line."""
        value = self.flag(*dests)
        if value is None:
            args = self.server_args
            value = next((args[d] for d in dests if args.get(d) is not None), None)
        return value

    @property
    def vllm(self) -> bool:
        """Whether the bundle is of vLLM (``facts.engine``, else a ``vllm`` command)."""
        engine = self.facts.get("engine")
        if isinstance(engine, str) and engine:
            return engine.lower() == "vllm"
        return any("vllm" in w for w in self.command_words()[:6])

    def engine_value(self, name: str) -> str | None:
        """A setting by its Python name (``gpu_memory_utilization``) as the command spells it
        (``--gpu-memory-utilization 0.9`` or ``=0.9``), else as the log prints the engine's
        arguments (vLLM's ``args: Namespace(…)``, ``non-default args: {…}``, ``name (0.98)``);
        the text, or ``None``. For settings SGLang's flag table does not parse (vLLM's)."""
        option = "--" + name.replace("_", "-")
        command = self.command_words()
        for i, word in enumerate(command):
            if word == option and i + 1 < len(command):
                return command[i + 1]
            if word.startswith(option + "="):
                return word.split("=", 1)[1]
        hit = self.log.first(_engine_arg(name))
        return hit[1]["value"] if hit else None

    def command_words(self) -> list[str]:
        """The command's words, a shell's ``-c`` script split into its own words (a container's
        ``/bin/sh -c "vllm serve …"``)."""
        words: list[str] = []
        for word in (str(a) for a in self.facts.get("command") or []):
            if " " in word:
                try:
                    words += shlex.split(word)
                except ValueError:
                    words += word.split()
            else:
                words.append(word)
        return words

    def engine_number(self, name: str) -> float | None:
        """``engine_value`` as a number, or ``None``."""
        try:
            value = float(self.engine_value(name) or "nan")
        except ValueError:
            return None
        return value if math.isfinite(value) else None

    def given(self, option: str) -> bool:
        """Whether the command spells ``option`` out (a default was not just applied)."""
        command = [str(a) for a in self.facts.get("command") or []]
        return any(a == option or a.startswith(option + "=") for a in command)

    def number(self, *dests: str) -> float | None:
        """A numeric setting, or ``None`` when it is unset or not a number."""
        value = self.setting(*dests)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok and math.isfinite(value) else None

    def count(self, *dests: str, default: int = 1) -> int:
        """A positive whole-number setting (a size, a count), else ``default``."""
        value = self.setting(*dests)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 1
        return int(value) if ok else default

    def tp(self) -> int:
        """The TP size: the command, the ``server_args`` line, else the highest TP tag + 1."""
        if self.vllm:  # SGLang's table parses a vLLM command into its own defaults
            size = self.engine_number("tensor_parallel_size")
            if size is not None and size >= 1:
                return int(size)
        value = self.count("tp_size", "tensor_parallel_size", default=0)
        if value:
            return value
        tags = [int(n) for line in self.log.lines for n in RANK_TAG.findall(_prefix(line))]
        return max(tags) + 1 if tags else 1

    def local_ranks(self) -> int:
        """The ranks on this node: the TP size over the nodes of the launch."""
        nodes = self.facts.get("nodes_in_launch")
        nodes = nodes if isinstance(nodes, int) and nodes >= 1 else 1
        return max(self.tp() // nodes, 1)

    def snapshots(self) -> list[Mapping[str, Any]]:
        return [s for s in self.facts.get("snapshots") or [] if isinstance(s, Mapping)]

    def notes(self) -> list[str]:
        """The snapshots' notes, oldest first, each as what it asserts (``plain_words``): a
        negated, asked or hypothetical mention of a failure is not evidence of it; then those of
        the other nodes of a multi-node launch, each after its node's tag."""
        return list(self._asserted_notes)

    def kernel_lines(self) -> list[str]:
        """The snapshots' kernel log lines, then those of the other nodes of a multi-node launch
        (each with its node's tag: the kernel of any node may have killed a rank), then the
        notes (as they assert): a collector may have written a kernel line it saw into a note."""
        lines = [str(line) for s in self.snapshots() for line in s.get("kernel_log") or []]
        lines += [
            f"[{node.name}] {line}"
            for node in self.group[1:]
            for s in node.snapshots
            for line in s.get("kernel_log") or []
        ]
        return lines + self.notes()

    @cached_property
    def _asserted_notes(self) -> tuple[str, ...]:
        found = [asserted(str(n)) for s in self.snapshots() for n in s.get("notes") or []]
        found += [
            f"[{node.name}] {said}"
            for node in self.group[1:]
            for s in node.snapshots
            for note in s.get("notes") or []
            if (said := asserted(str(note)))
        ]
        return tuple(n for n in found if n)

    def note_match(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        """The first snapshot note with ``pattern``: figures the collector wrote in words."""
        return next((m for m in map(pattern.search, self.notes()) if m), None)

    def gpu_label(self) -> str | None:
        """The node's GPU as people name it: ``L40S 48GB`` (decimal GB of the total)."""
        for gpu in (self.facts.get("node") or {}).get("gpus") or []:
            name = str((gpu or {}).get("name") or "")
            if name:
                label = re.sub(r"^(?:NVIDIA|AMD Instinct|AMD)\s+", "", name)
                total = gpu.get("memory_total_bytes")
                if isinstance(total, int | float) and total > 0 and "GB" not in label:
                    label += f" {round(total / 1e9)}GB"
                return label
        return None


@dataclass(frozen=True)
class GroupNode:
    """One node of a multi-node launch as its bundle lists it (``extra.group``): its inventory
    name, node rank, the TP ranks it runs and its own snapshots (bundle-shaped, oldest first)."""

    name: str
    node_rank: int
    tp_ranks: tuple[int, ...]
    snapshots: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)

    @property
    def ranks(self) -> str:
        """``TP8–TP15`` (a run), ``TP8, TP10`` (otherwise), ``""`` (none listed)."""
        ranks = sorted(self.tp_ranks)
        if not ranks:
            return ""
        if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
            return f"TP{ranks[0]}–TP{ranks[-1]}"
        return ", ".join(f"TP{r}" for r in ranks)

    @property
    def label(self) -> str:
        """The node as an operator reads it: ``node-b (node rank 1, TP8–TP15)``."""
        ranks = f", {self.ranks}" if self.ranks else ""
        return f"{self.name} (node rank {self.node_rank}{ranks})"


def group_of(facts: Mapping[str, Any]) -> tuple[GroupNode, ...]:
    """``extra.group`` of a bundle's facts as ``GroupNode``s in node-rank order; entries that
    are not of its shape are left out; ``()`` without at least two nodes."""
    extra = facts.get("extra")
    entries = extra.get("group") if isinstance(extra, Mapping) else None
    if not isinstance(entries, list):
        return ()
    nodes: list[GroupNode] = []
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        rank = entry.get("node_rank")
        tp = entry.get("tp_ranks")
        snapshots = entry.get("snapshots")
        nodes.append(
            GroupNode(
                entry["name"],
                rank if isinstance(rank, int) and not isinstance(rank, bool) else len(nodes),
                tuple(r for r in tp if isinstance(r, int)) if isinstance(tp, list) else (),
                tuple(s for s in snapshots if isinstance(s, Mapping))
                if isinstance(snapshots, list)
                else (),
            )
        )
    nodes.sort(key=lambda n: n.node_rank)
    return tuple(nodes) if len(nodes) > 1 else ()


SERVER_ARGS = re.compile(r"server_args=ServerArgs\((?P<args>.*)\)")


SERVER_ARG = re.compile(r"(?P<key>\w+)=(?P<value>'[^']*'|\"[^\"]*\"|\[[^\]]*\]|[^,()\[]+)")


# SGLang's log prefix: ``[YYYY-mm-dd HH:MM:SS{ DPd}{ TPt}...]`` (§3, "Log prefix format").
PREFIX = re.compile(r"^\[(?P<when>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)?(?P<tags>[^\]]*)\]")


RANK_TAG = re.compile(r"\bTP(\d+)\b")


def _prefix(line: str) -> str:
    match = PREFIX.match(line)
    return match["tags"] if match else ""


def _when(line: str) -> datetime | None:
    """The time in SGLang's log prefix, if the line has one."""
    match = PREFIX.match(line)
    try:
        return datetime.strptime(match["when"], "%Y-%m-%d %H:%M:%S") if match else None
    except ValueError:
        return None


Rule = Callable[[Bundle], Diagnosis | None]


def _num(text: str) -> float:
    return float(text)


def _fmt(value: float, places: int = 2) -> str:
    """Numbers as an operator reads them: 40 not 40.00, 44.87 kept."""
    text = f"{value:.{places}f}".rstrip("0").rstrip(".")
    return text if text not in ("-0", "") else "0"


# tqdm's progress of the checkpoint (SGLang and vLLM print the same bar).
SHARDS = re.compile(r"checkpoint shards:\s*\d+% Completed \| (?P<done>\d+)/(?P<total>\d+)")


LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=(?P<avail>[\d.]+) GB")


LOAD_END = re.compile(
    r"Load weight end\..*?avail mem=(?P<avail>[\d.]+) GB, mem usage=(?P<used>[\d.]+)"
)
