"""Start-up phases of an SGLang server, read from its log lines as they arrive.

The phases and the numbers SGLang prints in them (shared/reference/sglang.md §6, log signatures;
``model_runner.py``, ``memory_pool.py``, ``memory_pool_host.py``, ``http_server.py``):

1. distributed init (``Init torch distributed begin``),
2. loading weights (``Load weight begin. avail mem=X GB``; tqdm ``Loading safetensors checkpoint
   shards:  NN% Completed | a/b``; ``Load weight end. … mem usage=X GB``),
3. KV cache allocated (``KV Cache is allocated. #tokens: N``),
4. CUDA graphs (``Capture cuda graph begin`` ≤0.5.9, ``CUDA graph begin`` 0.5.23),
5. host pool of the hierarchical cache (``Allocating X GB host memory for hierarchical KV cache``
   ≤0.5.18, ``hierarchical KV host pool: N tokens, X GB`` 0.5.21+), one line per TP rank,
6. warm-up (uvicorn started: ``Uvicorn running on``),
7. ready (``The server is fired up and ready to roll!``, node 0 only).

SGLang prints GB in these lines for values computed in GiB (``/ (1 << 30)``) in the memory lines
(avail mem, mem usage) and in decimal GB (``/ 1e9``) in the host-pool lines; ``numbers`` keeps
them as printed, with the unit in the key.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

READY_MARKER = "The server is fired up and ready to roll!"

PHASES: tuple[tuple[str, str], ...] = (
    ("distributed", "Distributed init"),
    ("weights", "Loading weights"),
    ("kv_cache", "KV cache"),
    ("cuda_graphs", "CUDA graphs"),
    ("host_pool", "Host pool"),
    ("warmup", "Warm-up"),
    ("ready", "Ready"),
)
_INDEX = {key: i for i, (key, _) in enumerate(PHASES)}

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("distributed", re.compile(r"Init torch distributed begin")),
    ("weights", re.compile(r"Load weight begin\. avail mem=(?P<avail_mem_gib>[\d.]+) GB")),
    (
        "weights",
        re.compile(
            r"Loading (?:safetensors|pt) checkpoint shards:\s*(?P<shards_percent>\d+)% Completed"
            r" \| (?P<shards_done>\d+)/(?P<shards_total>\d+)"
        ),
    ),
    ("weights", re.compile(r"Load weight end\..*?mem usage=(?P<weights_gib>[\d.]+) GB")),
    ("kv_cache", re.compile(r"KV Cache is allocated\. #tokens: (?P<kv_tokens>\d+)")),
    ("cuda_graphs", re.compile(r"(?:Capture cuda graph|CUDA graph) begin")),
    (
        "cuda_graphs",
        re.compile(r"(?:Capture cuda graph|CUDA graph) end.*?mem usage=(?P<graph_gib>[\d.]+) GB"),
    ),
    ("kv_cache", re.compile(r"max_total_num_tokens=(?P<max_total_num_tokens>\d+)")),
    (
        "host_pool",
        re.compile(r"Allocating (?P<host_pool_gb>[\d.]+) GB host memory for hierarchical KV"),
    ),
    (
        "host_pool",
        re.compile(r"hierarchical KV host pool: \d+ tokens, (?P<host_pool_gb>[\d.]+) GB"),
    ),
    ("warmup", re.compile(r"Uvicorn running on|Application startup complete")),
    ("ready", re.compile(re.escape(READY_MARKER))),
)


@dataclass
class Progress:
    """Where start-up is: the furthest phase reached and the numbers printed so far.

    ``numbers`` keys: ``avail_mem_gib``, ``weights_gib``, ``shards_done``, ``shards_total``,
    ``shards_percent``, ``kv_tokens``, ``max_total_num_tokens``, ``graph_gib``,
    ``host_pool_gb`` (per TP rank), ``host_pool_lines`` (ranks that printed one).
    """

    phase: str = ""
    numbers: dict[str, float] = field(default_factory=dict)

    @property
    def ready_line_seen(self) -> bool:
        return self.phase == "ready"

    def fraction(self) -> float:
        """0.0 – 1.0 for the phase bar; shard progress fills the weights phase."""
        if not self.phase:
            return 0.0
        index = _INDEX[self.phase]
        partial = 0.0
        if self.phase == "weights" and self.numbers.get("shards_total"):
            partial = self.numbers.get("shards_done", 0) / self.numbers["shards_total"]
        return min(1.0, (index + partial) / (len(PHASES) - 1))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None) -> Progress:
        doc = doc or {}
        return cls(phase=str(doc.get("phase", "")), numbers=dict(doc.get("numbers", {})))


def advance(progress: Progress, line: str, *, partial: bool = False) -> bool:
    """Update ``progress`` from one log line; returns whether anything changed. A ``partial``
    line (still being written, e.g. a moving progress bar) is not counted as a rank's line."""
    changed = False
    for phase, pattern in _RULES:
        match = pattern.search(line)
        if match is None:
            continue
        if not progress.phase or _INDEX[phase] > _INDEX[progress.phase]:
            progress.phase = phase
            changed = True
        for key, value in match.groupdict().items():
            number = float(value)
            if progress.numbers.get(key) != number:
                progress.numbers[key] = number
                changed = True
        if phase == "host_pool" and not partial:
            progress.numbers["host_pool_lines"] = progress.numbers.get("host_pool_lines", 0) + 1
            changed = True
    return changed


def phase_label(key: str) -> str:
    return dict(PHASES).get(key, key or "not started")
