"""What the memory budget reads and returns: a node's memory (``NodeMemory``), figures SGLang
logged (``Observed``), and the report with its messages (``BudgetReport``). All sizes are bytes.

The budget itself is ``nodes.domain.budget.check``; this module holds no arithmetic, so that
the parts of the budget in modules of their own can share these types without importing
``budget``. Import them from ``nodes.domain.budget``, which re-exports them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Neighbour:
    """Another launch on the node and the host memory it committed (bytes): its host pools over
    its ranks here plus pinned buffers. ``pinned``: it allocated them (its log said so), so
    MemAvailable counts them already. ``label`` names it: ``#12 (llama@3)``."""

    label: str
    host_bytes: int
    pinned: bool = False


@dataclass(frozen=True)
class NodeMemory:
    """A node as the budget sees it. ``gpu_used_bytes`` is what other processes hold now;
    ``neighbours`` the other launches on the node with what they committed."""

    gpu_memory_bytes: tuple[int, ...]
    host_ram_bytes: int | None
    mem_available_bytes: int | None = None
    cgroup_limit_bytes: int | None = None
    gpu_used_bytes: tuple[int, ...] | None = None
    gpu_names: tuple[str, ...] | None = None
    neighbours: tuple[Neighbour, ...] = ()
    #: Host memory (bytes) the checked profile's own launches pinned, counted back into
    #: ``mem_available_bytes`` (a revision is checked as its own launch would find the node).
    own_pinned_bytes: int = 0
    #: Whose pinned memory ``own_pinned_bytes`` is, in words.
    given_back_by: str = "this profile's own launches"

    @classmethod
    def from_document(cls, node: Any, mem_available_bytes: Any = None) -> NodeMemory:
        """The node of a JSON document: ``manage.py budget --node``'s file, or a failure
        bundle's ``facts.node`` (``{"host_ram_bytes": int, "gpus": [{"memory_total_bytes": int,
        "name": str}], "mem_available_bytes": int, "cgroup_limit_bytes": int}``, sizes in
        bytes). ``mem_available_bytes`` given wins over the document's. Raises ``ValueError``
        where a GPU or a size is missing or not a whole number from 0 to 2^63."""
        try:
            gpus = list(node["gpus"])
            available = node.get("mem_available_bytes")
            return cls(
                gpu_memory_bytes=tuple(json_size(g["memory_total_bytes"]) for g in gpus),
                host_ram_bytes=json_size_or_none(node.get("host_ram_bytes")),
                mem_available_bytes=json_size_or_none(
                    available if mem_available_bytes is None else mem_available_bytes
                ),
                cgroup_limit_bytes=json_size_or_none(node.get("cgroup_limit_bytes")),
                gpu_names=tuple(str(g.get("name") or "") for g in gpus),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a node document: {exc!r}") from None


def json_size(value: Any) -> int:
    """A size in bytes from JSON: a whole number from 0 to 2^63, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ValueError(f"not a size in bytes: {value!r}"[:120])
    return value


def json_size_or_none(value: Any) -> int | None:
    """``json_size``, or ``None`` for ``None``."""
    return None if value is None else json_size(value)


@dataclass(frozen=True)
class Observed:
    """Figures SGLang logged for this model on this GPU class, replacing the estimates.

    ``free_before_load_bytes``: ``Load weight begin. avail mem=`` (the minimum over the GPUs);
    ``weights_per_rank_bytes``: ``Load weight end. … mem usage=``. ``label`` says where they
    came from ("observed", or "calibrated from launch #12 on node-b"); ``kind`` is
    ``observed`` or ``calibrated``.
    """

    free_before_load_bytes: int | None = None
    weights_per_rank_bytes: int | None = None
    label: str = "observed"
    kind: str = "observed"


@dataclass(frozen=True)
class Message:
    """``level`` is ``info``, ``warn`` or ``block``; ``code`` a stable identifier."""

    level: str
    code: str
    text: str


@dataclass
class BudgetReport:
    """The verdict (``ok``, ``warn``, ``block``), every line of the arithmetic, and the fix."""

    verdict: str = "ok"
    lines: list[str] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    ranks_per_node: int | None = None
    device_kv_tokens_per_rank: int | None = None
    device_kv_bytes_per_rank: int | None = None
    host_pool_bytes_per_rank: int | None = None
    host_pool_bytes_per_node: int | None = None
    host_budget_bytes: int | None = None
    #: A complete change (``{"--flag": value}``) that this check passes, and its verdict then.
    suggestion: dict[str, Any] | None = None
    suggestion_verdict: str | None = None
    #: What the suggestion costs (``Cost.to_json``): device KV tokens per rank and requests of
    #: ``request_tokens`` at once, before and after, and the sentence that says it.
    suggestion_cost: dict[str, Any] | None = None
    #: Other changes this check passes, each ``{"change", "verdict", "kv_tokens_per_rank",
    #: "text"}``: removing the feature that forced the suggestion (HiCache), with its cost.
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    weights_bytes_per_rank: int | None = None
    free_before_load_bytes: int | None = None
    #: Where the two figures came from: ``source`` (observed, calibrated, estimate, partly
    #: observed), ``label`` in words, and ``free_before_load``/``weights`` each.
    calibration: dict[str, str] = field(default_factory=dict)

    def add(self, level: str, code: str, text: str) -> None:
        self.messages.append(Message(level, code, text))
        rank = {"ok": 0, "info": 0, "warn": 1, "block": 2}
        if rank[level] > rank[self.verdict]:
            self.verdict = level

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["messages"] = [asdict(m) for m in self.messages]
        return doc
