"""The HiCache host pools the ranks pin (how big, how they were sized) against the host memory
they come out of: helpers for the host-memory rules and for rules that name the pools as the risk
behind another failure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodes.domain.diagnosis.evidence import Bundle, Evidence, GiB, _fmt, _num
from nodes.domain.geometry import GeometryError, from_config, kv_bytes_per_token, kv_elem_bytes

#: SGLang keeps this much host memory back in its HiCache check (§2): 10 GiB, printed as GB.
HOST_RESERVE_GB = 10 * GiB / 1e9


HOST_POOL = re.compile(
    r"Allocating (?P<old>\d+(?:\.\d+)?) GB host memory for hierarchical KV cache|"
    r"hierarchical KV host pool: \d+ tokens, (?P<new>\d+(?:\.\d+)?) GB"
)
# The rank in SGLang's log prefix, ``[… DP0 TP3 …]`` or ``[… DP0_TP3 …]``.
PREFIX_RANK = re.compile(r"^\[[^\]]*?\b(?P<rank>(?:DP\d+[_ ])?TP\d+)\b")


#: The panel's plain words for the other launches on the node (``bundle.py``), as a person
#: would write them too: "other launches on the node …: #12 (llama@1) 420 GB (pinned), …".
NEIGHBOURS_NOTE = re.compile(
    r"(?i)\bother (?:launches|servers) on (?:the|this) node\b[^:]*:(?P<rest>.*)"
)
NEIGHBOUR = re.compile(r"(?P<label>#\d+ \([^()]*\)|[\w.@-]+) (?P<gb>\d[\d,]*(?:\.\d+)?) GB\b")


@dataclass(frozen=True)
class Neighbour:
    """Another launch on the same node and the host memory it pins (GB, decimal)."""

    label: str
    gb: float


def neighbours(bundle: Bundle) -> list[Neighbour]:
    """The other launches on the node with host pools of their own: the panel's facts
    (``extra.other_launches_on_node``: ``[{"label", "host_bytes", "pinned"}]``), else a
    snapshot note that lists them in words. Their pools and this one's share the host RAM."""
    rows = (bundle.facts.get("extra") or {}).get("other_launches_on_node")
    if isinstance(rows, list):
        found = [
            Neighbour(str(r.get("label") or "another launch"), r["host_bytes"] / 1e9)
            for r in rows
            if isinstance(r, dict) and isinstance(r.get("host_bytes"), int | float)
        ]
        return [n for n in found if n.gb > 0]
    note = bundle.note_match(NEIGHBOURS_NOTE)
    if note is None:
        return []
    return [
        Neighbour(m["label"], float(m["gb"].replace(",", "")))
        for m in NEIGHBOUR.finditer(note["rest"])
        if float(m["gb"].replace(",", "")) > 0
    ]


def said(others: list[Neighbour]) -> str:
    """``#12 (llama@1) 420 GB + #14 (qwen@2) 140 GB``."""
    return " + ".join(f"{n.label} {_fmt(n.gb)} GB" for n in others)


def _available_before(bundle: Bundle) -> float | None:
    """MemAvailable (GB) in the last snapshot taken before the launch, if any."""
    for snapshot in reversed(bundle.facts.get("snapshots") or []):
        if snapshot.get("phase") == "before_launch":
            value = (snapshot.get("meminfo") or {}).get("MemAvailable")
            return value / 1e9 if isinstance(value, int | float) and value > 0 else None
    return None


@dataclass
class HostPools:
    """The HiCache host pools the log says each rank pins (``Allocating … GB host memory``, §2):
    per rank, the sizes in decimal GB in log order."""

    hits: list[tuple[int, re.Match[str]]]
    per_rank: dict[str, list[float]]

    @property
    def ranks(self) -> int:
        return len(self.per_rank)

    @property
    def pools(self) -> list[float]:
        return max(self.per_rank.values(), key=len)

    @property
    def each(self) -> float:
        return round(sum(self.pools), 2)

    @property
    def total(self) -> float:
        return round(sum(sum(v) for v in self.per_rank.values()), 2)


def _host_pools(bundle: Bundle) -> HostPools | None:
    hits = bundle.log.find(HOST_POOL)
    if not hits:
        return None
    per_rank: dict[str, list[float]] = {}
    for number, match in hits:
        tag = PREFIX_RANK.search(bundle.log.lines[number - 1])
        rank = tag["rank"].replace(" ", "_") if tag else f"line{number}"
        per_rank.setdefault(rank, []).append(_num(match["old"] or match["new"]))
    return HostPools(hits, per_rank)


KV_ALLOCATED = re.compile(
    r"KV Cache is allocated\..*?#tokens: (?P<tokens>\d+), (?:K size: (?P<k>[\d.]+) GB, V size: "
    r"(?P<v>[\d.]+) GB|KV size: (?P<kv>[\d.]+) GB)"
)


def _device_kv(bundle: Bundle) -> tuple[int, float] | None:
    """Tokens and GiB of one rank's device KV pool (``KV Cache is allocated``; its "GB" is GiB,
    §3)."""
    hits = bundle.log.find(KV_ALLOCATED)
    if not hits:
        return None
    match = hits[-1][1]
    gib = _num(match["kv"]) if match["kv"] else _num(match["k"]) + _num(match["v"])
    return int(match["tokens"]), round(gib, 2)


def _host_pool_source(bundle: Bundle) -> tuple[str, dict[str, float]]:
    """How the host pool was sized (§1d): ``--hicache-size`` GB per rank, else ``--hicache-ratio``
    × the rank's device KV pool, the ratio defaulting to 2.0."""
    size = bundle.setting("hicache_size")
    if isinstance(size, int | float) and size > 0:
        return f"--hicache-size {_fmt(size)} GB", {"hicache_size_gb": size}
    ratio = bundle.number("hicache_ratio") or 2.0
    numbers: dict[str, float] = {"hicache_ratio": ratio}
    source = (
        f"{'' if bundle.given('--hicache-ratio') else 'the default '}--hicache-ratio {_fmt(ratio)}"
    )
    kv = _device_kv(bundle)
    if kv is not None:
        tokens, gib = kv
        numbers.update(max_total_num_tokens=tokens, device_kv_gib_per_rank=gib)
        per_token = _kv_bytes_per_token(bundle)
        if per_token:
            numbers.update(kv_bytes_per_token=per_token)
            numbers["device_kv_gb_per_rank"] = round(tokens * per_token / 1e9, 2)
            pool = (
                f"{tokens} tokens x {per_token} B = {numbers['device_kv_gb_per_rank']:.2f} GB = "
                f"{gib:.2f} GiB"
            )
        else:
            pool = f"{tokens} tokens, {gib:.2f} GiB"
        source += f" x the rank's device KV pool ({pool})"
    return source, numbers


def _kv_bytes_per_token(bundle: Bundle) -> int | None:
    """KV bytes per token on one rank from the model's config (§3): attention TP is tp / dp
    under DP attention."""
    config = bundle.facts.get("model_config")
    if not isinstance(config, dict):
        return None
    try:
        geometry = from_config(config)
    except GeometryError:
        return None
    tp = bundle.tp()
    if bundle.setting("enable_dp_attention"):
        tp = max(1, tp // bundle.count("dp_size", "data_parallel_size"))
    pp = bundle.count("pp_size", "pipeline_parallel_size")
    dtype = str(bundle.setting("kv_cache_dtype") or "auto")
    return kv_bytes_per_token(geometry, tp, pp, kv_elem_bytes(dtype, geometry.torch_dtype))


BUDGET_NOTE = re.compile(r"(?i)\bbudget\b[^:.]*:\s*(?P<gb>\d[\d,]*(?:\.\d+)?)\s*GB\b")


def _host_share(bundle: Bundle) -> tuple[float, str] | None:
    """This server's share of the host RAM in GB: a budget stated for it, else what the other
    launches on the node leave of its RAM when they are known, else the node's RAM × the
    fraction of the node's GPUs it uses (neighbours on the other GPUs get theirs)."""
    note = bundle.note_match(BUDGET_NOTE)
    if note is not None:
        return float(note["gb"].replace(",", "")), "this server's host budget"
    ram = bundle.host_ram_gb()
    if ram is None:
        return None
    if others := neighbours(bundle):
        left = max(0.0, ram - sum(n.gb for n in others))
        return left, f"what {said(others)} leave of the {_fmt(ram)} GB host"
    node_gpus = len((bundle.facts.get("node") or {}).get("gpus") or [])
    used = bundle.tp() * bundle.count("pp_size", "pipeline_parallel_size")
    if not bundle.setting("enable_dp_attention"):
        used *= bundle.count("dp_size", "data_parallel_size")
    used //= bundle.count("nnodes")
    if 0 < used < node_gpus:
        return (
            ram * used / node_gpus,
            f"this server's {used}/{node_gpus} GPU share of the {_fmt(ram)} GB host",
        )
    return ram, "host RAM"


def _hicache_risk(bundle: Bundle) -> tuple[str, dict[str, float], list[Evidence]] | None:
    """The pinned host pools take more than half of this server's share of the host RAM: the
    risk behind another failure (secondary ``host-oom-hicache``; §2, §9 rule 1)."""
    pools, share = _host_pools(bundle), _host_share(bundle)
    if pools is None or share is None or pools.total <= 0.5 * share[0]:
        return None
    source, numbers = _host_pool_source(bundle)
    numbers.update(
        hicache_gb_per_rank=pools.each,
        local_ranks=pools.ranks,
        hicache_gb_total=pools.total,
        host_share_gb=round(share[0], 2),
    )
    ram = bundle.host_ram_gb()
    if ram is not None:
        numbers["host_ram_gb"] = round(ram, 2)
    text = (
        f"{source} makes {pools.each:.2f} GB of pinned host pool per rank x {pools.ranks} ranks "
        f"= {pools.total:.2f} GB, {pools.total / share[0]:.2f} of {share[1]}"
    )
    return text, numbers, [bundle.evidence(hit) for hit in pools.hits[: pools.ranks]]
