"""Rules for a node set up unlike the others (issue 22): an interface that NCCL_SOCKET_IFNAME or
GLOO_SOCKET_IFNAME names and the node does not have, and NCCL versions that differ between the
nodes. Both fail distributed init right after torch's store, in what SGLang makes next
(simfleet/multinode-sources.md, "After the store"):

- the world group's Gloo group: torch makes one Gloo device per name in ``GLOO_SOCKET_IFNAME``,
  looked up by its exact name among the node's interfaces with an address; on a node without it
  every rank fails ``[enforce fail at …/gloo/transport/tcp/device.cc:84] ifa != nullptr. Unable to
  find address for: NAME``;
- the TP group's NCCL communicator: NCCL's bootstrap selects the interfaces whose names start with
  a prefix listed in ``NCCL_SOCKET_IFNAME`` (``^`` excludes them, ``=`` makes them exact); none
  is ``NCCL WARN Bootstrap : no socket interface found`` (printed only at NCCL_DEBUG=WARN or
  above) and ``ncclInvalidUsage``, which SGLang's pynccl raises as ``RuntimeError: NCCL error:
  invalid usage (run with NCCL_DEBUG=WARN for details)``; the other nodes' ranks wait in the
  bootstrap, which has no timeout;
- NCCL's version check (``init.cc initTransportsRank``): every rank compares every rank's
  ``NCCL_VERSION_CODE`` with its own, ``Mismatched NCCL version detected : rank I version V rank R
  version W``, and every rank of every node fails with the same ``invalid usage``.

A line's node is its tag, else its rank's node in the group (``multinode.node_of_line``), else
the node of the rank whose traceback it ends; what a node has is its latest snapshot's
``network.interfaces``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from nodes.domain.diagnosis.evidence import (
    RANK_TAG,
    Bundle,
    Diagnosis,
    Evidence,
    GroupNode,
    Hit,
    Rule,
    _prefix,
)
from nodes.domain.diagnosis.multinode import (
    DIST_PROGRESS,
    NCCL_CONNECT,
    RANK_RAISED,
    Layout,
    _both,
    _label,
    _raised_error,
    layout,
    node_of_line,
)
from nodes.domain.diagnosis.nccl import DIST_BEGIN
from nodes.domain.node_group import interface_matches

GLOO_VARIABLE, NCCL_VARIABLE = "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"
# Gloo's ``lookupAddrForIface`` (transport/tcp/device.cc), raised through torch.
GLOO_NO_ADDRESS = re.compile(r"Unable to find address for: ?(?P<name>[^\s'\"]+)")
# NCCL's ``bootstrapNetInit`` (bootstrap.cc) and its socket transport's own lookup; the wording
# has varied ("no NCCL_SOCKET_IFNAME interface found" was proposed in NVIDIA/nccl#1837).
NCCL_NO_INTERFACE = re.compile(
    r"NCCL WARN (?:Bootstrap|NET/Socket) ?: [Nn]o (?:[\w ]+ )?interface found"
)
# What pynccl raises for any NCCL failure; the one a missing interface or a version gives.
NCCL_ERROR = re.compile(r"NCCL error")
INVALID_USAGE = re.compile(r"NCCL error: invalid usage")
NCCL_VERSIONS = re.compile(
    r"Mismatched NCCL version detected : rank (?P<peer>\d+) version (?P<peer_code>\d+) "
    r"rank (?P<rank>\d+) version (?P<code>\d+)"
)
# pynccl's line on the TP group's rank 0: the NCCL of node 0's ranks.
SGLANG_NCCL = re.compile(r"sglang is using nccl==(?P<version>\d+\.\d+\.\d+)")


# --- what a node has --------------------------------------------------------------------------


@dataclass(frozen=True)
class Interface:
    """One interface of a node's snapshot, with its IPv4 address (``10.0.0.2/24``)."""

    name: str
    ipv4: str

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
        try:
            return ipaddress.ip_interface(self.ipv4).network
        except ValueError:
            return None

    @property
    def loopback(self) -> bool:
        network = self.network
        return self.name == "lo" or (network is not None and network.network_address.is_loopback)

    def __str__(self) -> str:
        return f"{self.name} {self.ipv4}" if self.ipv4 else self.name


def interfaces_of(node: GroupNode) -> tuple[Interface, ...]:
    """The interfaces the node's latest snapshot that lists any lists; ``()`` when none does."""
    for snapshot in reversed(node.snapshots):
        listed = (snapshot.get("network") or {}).get("interfaces") or []
        found = tuple(
            Interface(str(i.get("name")), str(i.get("ipv4") or ""))
            for i in listed
            if isinstance(i.get("name"), str) and i.get("name")
        )
        if found:
            return found
    return ()


def gloo_missing(value: str, names: Sequence[str]) -> list[str]:
    """The names of ``GLOO_SOCKET_IFNAME`` (comma-separated, each an exact name; torch reads it
    when longer than one character) that are not among ``names``."""
    if len(value) <= 1:
        return []
    return [n for n in value.split(",") if n and n not in names]


def nccl_selects(value: str, names: Sequence[str]) -> list[str]:
    """The names of ``names`` that ``NCCL_SOCKET_IFNAME`` selects (``node_group.interface_matches``:
    NCCL's own reading of it, the one pre-flight uses)."""
    return [name for name in names if interface_matches(value, name)]


def _lacks(variable: str, value: str, have: Sequence[Interface]) -> bool:
    """Whether a node with interfaces ``have`` (listed: not empty) lacks what ``value`` names."""
    names = [i.name for i in have]
    if variable == GLOO_VARIABLE:
        return bool(gloo_missing(value, names))
    return len(value) > 1 and not nccl_selects(value, names)


# --- an interface named that a node does not have ----------------------------------------------


@dataclass(frozen=True)
class Raise:
    """A rank that raised during distributed init: its ``Scheduler hit an exception`` line, its
    TP rank, its node and the traceback's last line."""

    raised: Hit
    rank: int
    node: GroupNode | None
    error: Hit


@dataclass(frozen=True)
class Missing:
    """A node without the interface ``variable`` names: the node (``None`` where no line or
    layout places it), the variable's value (as the launch's environment has it, else the name
    in the line), the lines that show it, how they show it (``gloo``: Gloo's lookup;
    ``nccl-warn``: NCCL's warning; ``nccl-error``: ranks that raised NCCL's error on a node whose
    snapshot shows no interface the value selects), what the node has (``()`` where no snapshot
    lists it) and the ranks whose failure the log shows (``raised``)."""

    variable: str
    value: str
    node: GroupNode | None
    hits: tuple[Hit, ...]
    how: str
    has: tuple[Interface, ...]
    raised: tuple[Raise, ...] = ()

    @property
    def ranks(self) -> list[int]:
        return sorted({r.rank for r in self.raised})


def _nodes(bundle: Bundle) -> Layout:
    """The launch's nodes (``multinode.layout``); a one-node launch as one node named by the
    bundle, with its snapshots, so that its interfaces are read the same way."""
    found = layout(bundle)
    if found is not None:
        return found
    name = str((bundle.facts.get("node") or {}).get("name") or "the node")
    tp = bundle.tp()
    only = GroupNode(name, 0, tuple(range(tp)), tuple(bundle.snapshots()))
    return Layout((only,), tp, bundle.count("pp_size", "pipeline_parallel_size", default=1))


def _node_of(
    bundle: Bundle, found: Layout, number: int, raises: Sequence[Raise]
) -> GroupNode | None:
    """The node that printed line ``number``: ``node_of_line``, else that of the rank whose
    traceback it ends, else the only node."""
    node = node_of_line(bundle, found, number)
    if node is None:
        node = next((r.node for r in raises if r.error[0] == number), None)
    if node is None and len(found.nodes) == 1:
        node = found.nodes[0]
    return node


def init_raises(bundle: Bundle, found: Layout) -> list[Raise]:
    """Every rank that raised after its node's ``Init torch distributed begin`` and before that
    node's init went further, with the traceback's last line."""
    alone = len(found.nodes) == 1

    def on(node: GroupNode | None, number: int) -> bool:
        return alone or node_of_line(bundle, found, number) == node

    out = []
    for hit in bundle.log.find(RANK_RAISED):
        tags = RANK_TAG.findall(_prefix(bundle.log.lines[hit[0] - 1]))
        if not tags:
            continue
        node = found.nodes[0] if alone else node_of_line(bundle, found, hit[0])
        began = [n for n, _ in bundle.log.find(DIST_BEGIN) if n < hit[0] and on(node, n)]
        if not began or any(
            began[-1] < n < hit[0] and on(node, n) for n, _ in bundle.log.find(DIST_PROGRESS)
        ):
            continue
        error = _raised_error(bundle, hit)
        if error is not None:
            out.append(Raise(hit, int(tags[-1]), node, error))
    return out


def _env(bundle: Bundle, variable: str) -> str | None:
    value = (bundle.facts.get("env") or {}).get(variable)
    return str(value) if value else None


def _missing(bundle: Bundle) -> list[Missing]:
    nccl = _env(bundle, NCCL_VARIABLE)
    shown = any(bundle.log.find(p) for p in (GLOO_NO_ADDRESS, NCCL_NO_INTERFACE))
    if not shown and (nccl is None or not bundle.log.find(RANK_RAISED)):
        return []
    found = _nodes(bundle)
    raises = init_raises(bundle, found)
    out: list[Missing] = []
    gloo: dict[tuple[GroupNode | None, str], list[Hit]] = {}
    for hit in bundle.log.find(GLOO_NO_ADDRESS):
        node = _node_of(bundle, found, hit[0], raises)
        gloo.setdefault((node, hit[1]["name"]), []).append(hit)
    for (node, name), hits in gloo.items():
        value = _env(bundle, GLOO_VARIABLE) or name
        lines = {h[0] for h in hits}
        mine = tuple(r for r in raises if r.error[0] in lines)
        out.append(Missing(GLOO_VARIABLE, value, node, tuple(hits), "gloo", _has_of(node), mine))
    warned: dict[GroupNode | None, list[Hit]] = {}
    for hit in bundle.log.find(NCCL_NO_INTERFACE):
        warned.setdefault(_node_of(bundle, found, hit[0], raises), []).append(hit)
    for node, hits in warned.items():
        mine = tuple(
            r
            for r in raises
            if r.node == node and r.raised[0] > hits[0][0] and NCCL_ERROR.search(r.error[1]["what"])
        )
        out.append(
            Missing(NCCL_VARIABLE, nccl or "", node, tuple(hits), "nccl-warn", _has_of(node), mine)
        )
    if nccl is not None:
        out += _missing_by_snapshot(bundle, found, raises, nccl, set(warned))
    return sorted(out, key=lambda m: m.hits[0][0])


def _has_of(node: GroupNode | None) -> tuple[Interface, ...]:
    return interfaces_of(node) if node is not None else ()


def _missing_by_snapshot(
    bundle: Bundle,
    found: Layout,
    raises: Sequence[Raise],
    value: str,
    warned: set[GroupNode | None],
) -> list[Missing]:
    """Nodes whose snapshot shows no interface ``NCCL_SOCKET_IFNAME`` selects and whose ranks
    raised NCCL's error during init, without NCCL's warning (NCCL_DEBUG below WARN). A node
    whose NCCL got as far as connecting to a peer had an interface: it is not one."""
    out = []
    for node in found.nodes:
        has = interfaces_of(node)
        if node in warned or not has or not _lacks(NCCL_VARIABLE, value, has):
            continue
        if any(node_of_line(bundle, found, n) == node for n, _ in bundle.log.find(NCCL_CONNECT)):
            continue
        mine = tuple(r for r in raises if r.node == node and NCCL_ERROR.search(r.error[1]["what"]))
        if mine:
            hits = tuple(r.error for r in mine)
            out.append(Missing(NCCL_VARIABLE, value, node, hits, "nccl-error", has, mine))
    return out


def interface_missing(bundle: Bundle) -> Diagnosis | None:
    """An interface named by GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME that a node does not have:
    Gloo's ``Unable to find address for``, NCCL's ``no socket interface found``, or NCCL's error
    raised on a node whose snapshot lists no interface the launch's NCCL_SOCKET_IFNAME selects.
    Names the node and its ranks, the variable and the interface, what the node has, and the one
    on the network the nodes share."""
    found = _missing(bundle)
    return None if not found else _missing_diagnosis(bundle, found)


def _where(node: GroupNode | None, several: bool) -> str:
    if node is None:
        return "a node"
    return _label(node) if several else node.name


def _meeting(nodes: Sequence[GroupNode], variable: str, value: str) -> dict[GroupNode, Interface]:
    """Each node's interface on the network every node has an address in (from their snapshots),
    preferring the network of the interface the variable names where a node has it; ``{}``
    where a node's interfaces are not listed or no network is shared."""
    listed = {node: interfaces_of(node) for node in nodes}
    if len(nodes) < 2 or not all(listed.values()):
        return {}
    named = {
        i.network
        for have in listed.values()
        for i in have
        if not _lacks(variable, value, [i]) and i.network is not None
    }
    candidates = sorted(
        {i.network for i in listed[nodes[0]] if i.network is not None and not i.loopback},
        key=lambda n: n not in named,
    )
    for network in candidates:
        chosen = {}
        for node, have in listed.items():
            mine = next((i for i in have if i.network == network), None)
            if mine is None:
                break
            chosen[node] = mine
        else:
            return chosen
    return {}


def _missing_diagnosis(bundle: Bundle, found: Sequence[Missing]) -> Diagnosis:
    nodes = _nodes(bundle)
    several = len(nodes.nodes) > 1
    first = found[0]
    meeting = _meeting(nodes.nodes, first.variable, first.value)
    said = [_one_missing(bundle, m, meeting, several) for m in found]
    tp = bundle.tp()
    numbers: dict[str, float] = {"tp_size": tp, "nnodes": len(nodes.nodes)}
    ranks = {r for m in found for r in m.ranks}
    if ranks:
        numbers["failing_ranks_in_log"] = len(ranks)
    evidence = []
    for m in found:
        shown = [m.raised[0].raised] if m.raised else []
        shown += [m.hits[0]] + ([m.raised[0].error] if m.raised and m.how == "nccl-warn" else [])
        evidence += [bundle.evidence(h) for _, h in sorted({h[0]: h for h in shown}.items())]
    for m in found:
        if m.node is not None and m.has:
            listed = ", ".join(map(str, m.has))
            evidence.append(Evidence(f"[{m.node.name}] interfaces: {listed}", None, "snapshot"))
    over = f" (TP {tp} over {len(nodes.nodes)} nodes)" if several else f" (TP {tp})"
    return Diagnosis(
        category="nccl-init-hang",
        summary="; ".join(said) + _left_waiting(bundle, nodes, found) + over,
        remedy=_missing_remedy(bundle, found, meeting, several),
        evidence=evidence,
        numbers=numbers,
    )


def _one_missing(
    bundle: Bundle, m: Missing, meeting: dict[GroupNode, Interface], several: bool
) -> str:
    where = _where(m.node, several)
    who = f" ({_both([f'TP{r}' for r in m.ranks])} in the log)" if m.ranks else ""
    line = f"line {m.hits[0][0]}"
    owner = f"{m.node.name}'s" if m.node is not None else "that node's"
    if m.how == "gloo":
        name = m.hits[0][1]["name"]
        head = f"{m.variable}={m.value}{_misread(m)} names an interface {where} does not have"
        how = (
            f"Gloo found no address for {name} when the world group was made, and {owner} "
            f"ranks died{who} ({line})"
        )
    elif m.value:
        head = f"{m.variable}={m.value}{_misread(m)} matches no interface of {where}"
        how = (
            f"NCCL's bootstrap found no socket interface there and its ranks failed "
            f"ncclCommInitRank with invalid usage{who} ({line})"
            if m.how == "nccl-warn"
            else f"its ranks failed NCCL's communicator init with invalid usage{who} ({line}), "
            "what NCCL returns when NCCL_SOCKET_IFNAME selects no interface (at NCCL_DEBUG=WARN "
            "it says `Bootstrap : no socket interface found`)"
        )
    else:
        head = (
            f"NCCL found no socket interface on {where}: NCCL_SOCKET_IFNAME is not in the "
            "launch's environment, so /etc/nccl.conf or ~/.nccl.conf may set it, or the node has "
            "no interface but lo and docker"
        )
        how = f"its ranks failed ncclCommInitRank with invalid usage{who} ({line})"
    return f"{head}: {how}" + _has(bundle, m, meeting)


def _misread(m: Missing) -> str:
    """What the value says of a misreading of the variable: an address where a name goes, NCCL's
    exclusion list given to Gloo; ``""`` otherwise."""
    for part in m.value.lstrip("^=").split(","):
        try:
            ipaddress.ip_address(part.split(":")[0] if part.count(":") == 1 else part)
        except ValueError:
            continue
        return " (an address: the variable takes an interface name)"
    if m.variable == GLOO_VARIABLE and m.value.startswith("^"):
        return " (NCCL's exclusion syntax: Gloo takes exact interface names)"
    return ""


def _has(bundle: Bundle, m: Missing, meeting: dict[GroupNode, Interface]) -> str:
    """``; gpu-a02 has eno1 …, bond0 … — bond0 is on 10.20.1.0/24, where gpu-a01 has bond1``,
    and the other variable where it names nothing there either; ``""`` without a snapshot."""
    if m.node is None or not m.has:
        return ""
    shown = [i for i in m.has if not i.loopback] or list(m.has)
    text = f"; {m.node.name} has {_both([str(i) for i in shown])}"
    mine = meeting.get(m.node)
    if mine is not None:
        others = [f"{n.name} has {i.name}" for n, i in meeting.items() if n != m.node]
        text += f" — {mine.name} is on {mine.network}, where {_both(others)}"
    other = NCCL_VARIABLE if m.variable == GLOO_VARIABLE else GLOO_VARIABLE
    value = _env(bundle, other)
    if value is not None and _lacks(other, value, m.has):
        text += f"; {other}={value} names nothing there either"
    return text


def _left_waiting(bundle: Bundle, nodes: Layout, found: Sequence[Missing]) -> str:
    """``; gpu-a01's ranks were left waiting for gpu-a02's``: the nodes that raised nothing."""
    failing = list(dict.fromkeys(m.node for m in found))
    raised = {r.node for r in init_raises(bundle, nodes)}
    waiting = [n for n in nodes.nodes if n not in failing and n not in raised]
    if len(nodes.nodes) < 2 or not waiting or None in failing:
        return ""
    gone = _both([n.name for n in failing if n is not None])
    if len(waiting) == 1:
        return f"; {waiting[0].name}'s ranks were left waiting for {gone}'s"
    return f"; the ranks of {_both([n.name for n in waiting])} were left waiting for {gone}'s"


def _missing_remedy(
    bundle: Bundle, found: Sequence[Missing], meeting: dict[GroupNode, Interface], several: bool
) -> str:
    variables = {m.variable for m in found} | {
        v for v in (GLOO_VARIABLE, NCCL_VARIABLE) if _env(bundle, v)
    }
    away = list(dict.fromkeys(m.node.name for m in found if m.node is not None))
    check = f"; `ip -br addr` on {_both(away)} lists what it has" if away else ""
    if not several:
        has = [i.name for m in found for i in m.has if not i.loopback]
        named = f" ({_both(has)})" if has else ""
        return (
            f"unset {_both(sorted(variables))}: a launch on one node needs no interface between "
            f"nodes; or name one the node has{named}" + check
        )
    parts = []
    if meeting:
        network = next(iter(meeting.values())).network
        head = f"name an interface every node has on the network they share ({network})"
        names = list(dict.fromkeys(i.name for i in meeting.values()))
        if NCCL_VARIABLE in variables:
            parts.append(
                "NCCL_SOCKET_IFNAME takes a list of prefixes, so "
                f"NCCL_SOCKET_IFNAME={','.join(names)} selects it on every node"
            )
        if GLOO_VARIABLE in variables:
            if len(names) == 1:
                parts.append(f"GLOO_SOCKET_IFNAME={names[0]} on every node")
            else:
                per = ", ".join(
                    f"GLOO_SOCKET_IFNAME={i.name} on {n.name}" for n, i in meeting.items()
                )
                parts.append(f"GLOO_SOCKET_IFNAME takes exact names, so set it per node ({per})")
    else:
        head = "name an interface every node has"
        if NCCL_VARIABLE in variables:
            parts.append(
                "NCCL_SOCKET_IFNAME takes a comma-separated list of prefixes, so one list can "
                "name each node's own"
            )
        if GLOO_VARIABLE in variables:
            parts.append("GLOO_SOCKET_IFNAME takes exact names, so set it per node")
    return (
        head
        + (": " + "; ".join(parts) if parts else "")
        + " — or leave them unset and let Rankwise pin each node's own interface on the network "
        "the nodes share" + check
    )


# --- NCCL versions that differ between the nodes -----------------------------------------------


def nccl_version(code: int) -> str:
    """``NCCL_VERSION_CODE`` as a release: X × 10000 + Y × 100 + Z from 2.9 (22705 is 2.27.5),
    X × 1000 + Y × 100 + Z before (2803 is 2.8.3)."""
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


@dataclass(frozen=True)
class Versions:
    """NCCL versions that differ between the nodes: each node's version codes as NCCL's
    warnings give them (``codes``), the warnings (``warnings``) or, without them, the ranks that
    raised ``invalid usage`` on node 0 and on other nodes (``raised``); node 0's version as
    SGLang printed it (``stated``) and the pre-flight's SGLang check (``check``: passed, detail)."""

    found: Layout
    codes: tuple[tuple[GroupNode, tuple[int, ...]], ...]
    warnings: tuple[Hit, ...]
    raised: tuple[Raise, ...]
    stated: Hit | None
    check: tuple[bool, str] | None


def _sglang_check(bundle: Bundle) -> tuple[bool, str] | None:
    """The pre-flight's ``sglang`` check of the group (``extra.checks``): (passed or
    overridden, its detail)."""
    checks = (bundle.facts.get("extra") or {}).get("checks")
    for check in checks if isinstance(checks, list) else []:
        if isinstance(check, dict) and check.get("name") == "sglang":
            return bool(check.get("passed")), str(check.get("detail") or "")
    return None


def _versions(bundle: Bundle) -> Versions | None:
    found = layout(bundle)
    if found is None:
        return None
    warnings = bundle.log.find(NCCL_VERSIONS)
    stated = bundle.log.first(SGLANG_NCCL)
    check = _sglang_check(bundle)
    if warnings:
        codes: dict[GroupNode, set[int]] = {}
        for number, match in warnings:
            printer = node_of_line(bundle, found, number)
            if printer is None and found.pp == 1:
                printer = found.of_rank(int(match["rank"]))
            if printer is not None:
                codes.setdefault(printer, set()).add(int(match["code"]))
            peer = found.of_rank(int(match["peer"])) if found.pp == 1 else None
            if peer is not None:
                codes.setdefault(peer, set()).add(int(match["peer_code"]))
        ordered = tuple((n, tuple(sorted(codes[n]))) for n in found.nodes if n in codes)
        return Versions(found, ordered, tuple(warnings), (), stated, check)
    raised = [r for r in init_raises(bundle, found) if INVALID_USAGE.search(r.error[1]["what"])]
    nodes = {r.node for r in raised}
    # A wrong interface fails one node's ranks and leaves node 0's waiting (or fails node 0's
    # alone); ranks of node 0 and of another node failing together is the check across ranks.
    if found.nodes[0] not in nodes or len(nodes - {None}) < 2:
        return None
    return Versions(found, (), (), tuple(raised), stated, check)


def nccl_versions_differ(bundle: Bundle) -> Diagnosis | None:
    """The nodes run different NCCL versions: NCCL's ``Mismatched NCCL version detected`` (each
    node's version, decoded), or ``invalid usage`` raised during init by ranks of node 0 and of
    another node together. Names the nodes, their versions where the log gives them, and the
    pre-flight's SGLang check."""
    found = _versions(bundle)
    return None if found is None else _versions_diagnosis(bundle, found)


def _versions_diagnosis(bundle: Bundle, found: Versions) -> Diagnosis:
    tp, count = bundle.tp(), len(found.found.nodes)
    numbers: dict[str, float] = {"tp_size": tp, "nnodes": count}
    if found.warnings:
        summary = (
            f"{_running(found)}; NCCL compares every rank's version when a communicator is made "
            f"(`Mismatched NCCL version detected`, line {found.warnings[0][0]}), so every rank "
            "failed with invalid usage"
        )
        for node, codes in found.codes:
            numbers[f"nccl_version_code_node{node.node_rank}"] = codes[0]
        evidence = _one_warning_per_node(bundle, found)
    else:
        nodes = list(dict.fromkeys(r.node for r in found.raised if r.node is not None))
        ranks = ", ".join(f"TP{r.rank}" for r in found.raised)
        summary = (
            f"ranks of {_both([_label(n) for n in nodes])} all failed NCCL's communicator init "
            f"with invalid usage ({ranks}, line {found.raised[0].error[0]}): ranks of node 0 and "
            "of another node failing together at that step is a check across all ranks, most "
            "likely NCCL's version check — the nodes run different NCCL (a wrong "
            "NCCL_SOCKET_IFNAME fails one node's ranks and leaves node 0's waiting); the log "
            "does not print the versions (NCCL_DEBUG=WARN does)"
        )
        evidence = []
        for node in nodes:
            raised = next(r for r in found.raised if r.node == node)
            evidence.append(bundle.evidence(raised.error))
    if found.stated is not None:
        summary += f"; node 0's SGLang says it uses NCCL {found.stated[1]['version']}"
        evidence.append(bundle.evidence(found.stated))
    if found.check is not None:
        passed, detail = found.check
        if passed:
            summary += f"; the pre-flight found the same SGLang on every node ({detail}), so " + (
                "the NCCL library itself differs"
                if found.warnings
                else "if the versions differ it is the NCCL library itself"
            )
        elif not passed:
            summary += f"; the pre-flight's version check was overridden: {detail.split(': ')[0]}"
        evidence.append(Evidence(f"pre-flight check sglang: {detail}", None, "snapshot"))
    return Diagnosis(
        category="nccl-init-hang",
        summary=summary + f" (TP {tp} over {count} nodes)",
        remedy=_versions_remedy(found),
        evidence=evidence,
        numbers=numbers,
    )


def _running(found: Versions) -> str:
    """``the nodes run different NCCL versions: h100-a (node rank 0, TP0–TP7) runs NCCL 2.27.5
    (version code 22705), h100-b (…) 2.27.3 (22703)``; by rank where the warnings cannot be
    placed on two nodes."""
    if len({codes for _, codes in found.codes}) > 1:
        said = [
            f"{_label(node)} {'runs NCCL ' if i == 0 else ''}"
            f"{_both([nccl_version(c) for c in codes])} "
            f"({'version code ' if i == 0 else ''}{_both([str(c) for c in codes])})"
            for i, (node, codes) in enumerate(found.codes)
        ]
        return "the nodes run different NCCL versions: " + ", ".join(said)
    match = found.warnings[0][1]
    peer, mine = int(match["peer_code"]), int(match["code"])
    return (
        f"the ranks run different NCCL versions: rank {match['peer']} runs NCCL "
        f"{nccl_version(peer)} (version code {peer}), rank {match['rank']} {nccl_version(mine)} "
        f"({mine})"
    )


def _one_warning_per_node(bundle: Bundle, found: Versions) -> list[Evidence]:
    seen: set[GroupNode | None] = set()
    out = []
    for hit in found.warnings:
        node = node_of_line(bundle, found.found, hit[0])
        if node not in seen:
            seen.add(node)
            out.append(bundle.evidence(hit))
    return out


def _versions_remedy(found: Versions) -> str:
    first = found.found.nodes[0]
    ours = dict(found.codes).get(first, ())
    differ = [(n, c) for n, c in found.codes if c != ours]
    which = ""
    if differ and ours:
        which = (
            " ("
            + "; ".join(
                f"{n.name} has {_both([nccl_version(c) for c in codes])}, {first.name} (node 0) "
                f"{_both([nccl_version(c) for c in ours])}"
                for n, codes in differ
            )
            + ")"
        )
    return (
        f"run the same NCCL on every node{which}: the same SGLang and torch release everywhere "
        "(one container image or one lock file), with the nvidia-nccl-cu12 that torch pins and no "
        "other libnccl found first (LD_LIBRARY_PATH); check each node with `python -c 'import "
        "torch; print(torch.cuda.nccl.version())'` and `pip show nvidia-nccl-cu12`, then relaunch"
        + ("" if found.warnings else " (with NCCL_DEBUG=WARN, which prints NCCL's own reason)")
    )


#: The line that alone shows each rule's failure, whatever its figures say (engine._unreadable).
RECOGNISES: dict[Rule, tuple[str, re.Pattern[str]]] = {
    interface_missing: (
        "nccl-init-hang",
        re.compile(r"Unable to find address for|NCCL WARN (?:Bootstrap|NET/Socket) ?: [Nn]o "),
    ),
    nccl_versions_differ: ("nccl-init-hang", re.compile(r"Mismatched NCCL version detected")),
}
