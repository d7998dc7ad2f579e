"""Rules for one server over several nodes (issue 22): the node and the ranks a failure belongs
to — a node whose ranks never joined the distributed store, a node that could not reach it, a
rank that died during init on one node, the nodes parted while serving — and ``locate``, which
names the node of any other diagnosis on a multi-node bundle.

How SGLang and torch meet across nodes (simfleet/multinode-sources.md): every node runs the same
flags with its own ``--node-rank R``; node R runs TP ranks R × per … R × per + per − 1 (per = tp ×
pp / nnodes). Global rank 0 (node 0, TP0) serves torch's TCP store at ``--dist-init-addr`` and
waits until every rank of the world has joined (``DistStoreError: Timed out after N seconds
waiting for clients. K/W clients joined.``); every rank, rank 0's too, connects to that address
(``The client socket has timed out after …s while trying to connect to (HOST, PORT)``; a
refused connection is retried without a word). Then NCCL bootstraps its communicators from rank
0's address (``NCCL WARN socketPollConnect: Connect to ADDR<PORT> returned 113(No route to
host)``). Once serving, every step's collectives span the nodes; a stalled one ends in NCCL's
watchdog on each rank that waited for it.

A multi-node bundle's log is every node's lines in one file, each ``[NODE] `` first (``Log``
takes the tag off and keeps it as the line's origin); ``extra.group`` lists the nodes with their
TP ranks and snapshots (``Bundle.group``). A bundle without the group (one node's log, as
operators paste them) is read by the command's ``--nnodes`` and TP size: nodes are then named by
node rank.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace

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
from nodes.domain.diagnosis.nccl import DIST_BEGIN, GLOO_LOOPBACK, LOOPBACK_REFUSED
from nodes.domain.diagnosis.plain_words import asserted
from nodes.domain.diagnosis.runtime import NCCL_WATCHDOG, SERVED

# torch's TCPStore, the store's host waiting for the world (``TCPStore.cpp`` waitForWorkers;
# torch < 2.2 said "workers").
STORE_WAIT = re.compile(
    r"Timed out after (?P<secs>\d+) seconds waiting for (?:clients|workers)\. "
    r"(?P<joined>\d+)/(?P<world>\d+) (?:clients|workers) joined"
)
# A rank that could not connect to the store: the timeout (``socket.cpp``, in seconds or in
# milliseconds by version), an errno other than a refusal, no address of the name at all.
STORE_CONNECT = re.compile(
    r"The client socket has timed out after (?P<time>\d+)(?P<unit>ms|s) while trying to "
    r"connect to \((?P<host>[^,()]+), (?P<port>\d+)\)|"
    r"The client socket has failed to connect to any network address of "
    r"\((?P<host2>[^,()]+), (?P<port2>\d+)\)|"
    r"The client socket has failed to connect to \[?(?P<host3>[^\]\s]+?)\]?:(?P<port3>\d+) "
    r"\(errno: (?P<errno>\d+) - (?P<why>[^)]+)\)"
)
# The store's host could not listen on its port (port-in-use: the clients' timeouts follow).
STORE_LISTEN = re.compile(r"The server socket has failed to listen")
# NCCL's socket layer (``misc/socket.cc``) failing to reach a peer during its bootstrap.
NCCL_CONNECT = re.compile(
    r"NCCL WARN (?:\w+: )?Connect to (?P<host>[^<\s]+)<(?P<port>\d+)> "
    r"(?:returned (?P<code>\d+)\((?P<why>[^)]+)\)|failed ?: (?P<why2>[^\n]+))"
)
# NCCL's own line prefix, ``host:pid:tid [cudaDev]``: the node's hostname on a log without tags.
NCCL_ORIGIN = re.compile(r"^(?P<host>[\w.-]+):\d+:\d+ \[(?P<dev>\d+)\]")
# SGLang: a scheduler raised (its traceback follows); a rank found dead by its launcher.
RANK_RAISED = re.compile(r"Scheduler hit an exception")
DIST_PROGRESS = re.compile(r"Init torch distributed ends|Load weight begin")
# The last line of a traceback: ``torch.distributed.DistStoreError: …``, ``RuntimeError: …``.
RAISED = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)): (?P<what>.+)")
# What a distributed init failure raises (NCCL, Gloo, torch's store and sockets).
DISTRIBUTED_ERROR = re.compile(
    r"NCCL error|Dist\w*Error|Gloo|ProcessGroup|connectFullMesh|socket|TCPStore|rendezvous",
    re.IGNORECASE,
)
# torch's prefix of a rank's C++ log lines: the global rank.
TORCH_RANK = re.compile(r"^\[rank(?P<rank>\d+)\]")
# A rank's own failure after the server was ready: then the collective's timeout is its effect.
RANK_ERROR_AFTER_READY = re.compile(
    r"Scheduler hit an exception|OutOfMemoryError|out of memory|CUDA error|Xid"
)
# The panel (or a person) saying a node could not be reached; the negative facts among its
# words, which ``plain_words`` would read as negations.
NOT_REACHED = re.compile(
    r"(?i)\b(?:did|does|do|could|can)(?: not|n[’']t) (?:answer|respond|be reached|reach)\w*|"
    r"\bcannot (?:answer|respond|be reached|reach)\w*|\bnot (?:answering|responding)\b"
)
UNREACHABLE = re.compile(
    r"(?i)\b(?:did not answer|does not answer|not answering|stopped answering|unreachable|"
    r"could not (?:be )?reach(?:ed)?|no route to host|lost|powered off|went down|is down)\b"
)


@dataclass(frozen=True)
class Layout:
    """The nodes of the launch (from the bundle's group, else named by node rank from the
    command's ``--nnodes``), the TP and PP sizes, and ranks per node."""

    nodes: tuple[GroupNode, ...]
    tp: int
    pp: int

    @property
    def world(self) -> int:
        return self.tp * self.pp

    @property
    def named(self) -> bool:
        """Whether the nodes have names (the bundle lists them) or only node ranks."""
        return not self.nodes[0].name.startswith("node rank ")

    def of_rank(self, rank: int) -> GroupNode | None:
        """The node running TP rank (or, with PP 1, global rank) ``rank``."""
        return next((n for n in self.nodes if rank in n.tp_ranks), None)

    def by_name(self, name: str) -> GroupNode | None:
        return next((n for n in self.nodes if n.name == name), None)


def layout(bundle: Bundle) -> Layout | None:
    """The launch's nodes when it runs on more than one (the bundle's group, else ``--nnodes``
    with TP only: node R runs TP R × per … (R + 1) × per − 1); ``None`` on one node."""
    pp = bundle.count("pp_size", "pipeline_parallel_size", default=1)
    if bundle.group:
        return Layout(bundle.group, bundle.tp(), pp)
    stated = bundle.facts.get("nodes_in_launch")
    nodes = bundle.count("nnodes", default=stated if isinstance(stated, int) else 1)
    if nodes < 2:
        return None
    tp = bundle.tp()
    if tp % nodes or pp > 1:
        return None  # with PP the ranks of a node are not a run of TP ranks: only the group says
    per = tp // nodes
    return Layout(
        tuple(
            GroupNode(f"node rank {r}", r, tuple(range(r * per, (r + 1) * per)))
            for r in range(nodes)
        ),
        tp,
        pp,
    )


def _label(node: GroupNode) -> str:
    """``node-b (node rank 1, TP8–TP15)``; a node known only by its rank: ``node rank 1
    (TP8–TP15)``."""
    if node.name.startswith("node rank "):
        return f"{node.name} ({node.ranks})" if node.ranks else node.name
    return node.label


def _both(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def node_of_line(bundle: Bundle, found: Layout, number: int) -> GroupNode | None:
    """The node that printed line ``number``: its tag, else the TP rank in SGLang's prefix,
    else torch's ``[rankN]`` (the global rank: the TP rank with PP 1), else NCCL's hostname
    when a node of that name is listed."""
    tagged = found.by_name(bundle.log.node(number))
    if tagged is not None:
        return tagged
    line = bundle.log.lines[number - 1]
    tags = RANK_TAG.findall(_prefix(line))
    if tags:
        return found.of_rank(int(tags[-1]))
    torch = TORCH_RANK.match(line)
    if torch is not None and found.pp == 1:
        return found.of_rank(int(torch["rank"]))
    nccl = NCCL_ORIGIN.match(line)
    return found.by_name(nccl["host"]) if nccl is not None else None


def _lines_of(
    bundle: Bundle, found: Layout, node: GroupNode, pattern: re.Pattern[str]
) -> list[Hit]:
    return [h for h in bundle.log.find(pattern) if node_of_line(bundle, found, h[0]) == node]


def _unreachable(node: GroupNode) -> str | None:
    """What the node's latest snapshot says of it not being reached: a note that asserts it (a
    negative fact, "did not answer", read as the fact it is, so a negated or hypothetical
    clause still asserts nothing)."""
    for snapshot in reversed(node.snapshots):
        for note in snapshot.get("notes") or []:
            text = str(note)
            said = asserted(NOT_REACHED.sub("unreachable", text))
            if said and UNREACHABLE.search(said):
                return text.removeprefix("panel: ").strip()[:200]
    return None


def _dist_address(bundle: Bundle) -> tuple[str, str] | None:
    """``--dist-init-addr`` as (host, port)."""
    addr = str(bundle.setting("dist_init_addr") or "")
    host, _, port = addr.rpartition(":")
    return (host.strip("[]"), port) if host and port.isdigit() else None


# --- the store: who never joined, who could not reach it ------------------------------------


@dataclass(frozen=True)
class StoreConnect:
    """A rank's failure to connect to the store: its line, the node, the address, the seconds it
    tried (when the line says) and the error (an errno's words)."""

    hit: Hit
    node: GroupNode | None
    host: str
    port: int
    seconds: float | None
    why: str | None


@dataclass(frozen=True)
class Rendezvous:
    """The store's rendezvous across the nodes: node 0's wait (``wait``: the line, seconds,
    ranks joined, world size), the ranks that could not connect (``connects``), the nodes whose
    ranks never joined (``absent``, with whether their ranks began distributed init) and the
    count not attributed to whole nodes (``unplaced``)."""

    found: Layout | None
    wait: Hit | None
    seconds: int | None
    joined: int | None
    world: int | None
    connects: tuple[StoreConnect, ...]
    absent: tuple[tuple[GroupNode, bool], ...]
    unplaced: int


def _store_connects(bundle: Bundle, found: Layout | None) -> list[StoreConnect]:
    out = []
    for hit in bundle.log.find(STORE_CONNECT):
        match = hit[1]
        host = match["host"] or match["host2"] or match["host3"]
        port = int(match["port"] or match["port2"] or match["port3"])
        seconds = None
        if match["time"]:
            seconds = int(match["time"]) / (1000 if match["unit"] == "ms" else 1)
        why = f"errno {match['errno']}: {match['why']}" if match["errno"] else None
        node = node_of_line(bundle, found, hit[0]) if found is not None else None
        out.append(StoreConnect(hit, node, host.removeprefix("::ffff:"), port, seconds, why))
    return out


def _rendezvous(bundle: Bundle) -> Rendezvous | None:
    if bundle.log.first(STORE_LISTEN) is not None:
        return None  # the store never listened: its port was taken (``ports.dist_store_in_use``)
    wait = bundle.log.first(STORE_WAIT)
    found = layout(bundle)
    connects = _store_connects(bundle, found)
    if wait is None and not connects:
        return None
    joined = int(wait[1]["joined"]) if wait else None
    world = int(wait[1]["world"]) if wait else None
    absent: list[tuple[GroupNode, bool]] = []
    unplaced = 0
    if found is not None:
        failing = {c.node for c in connects if c.node is not None}
        began = {node for node in found.nodes if _lines_of(bundle, found, node, DIST_BEGIN)}
        # Node 0 hosts the store: its ranks reach it unless their own lines say otherwise.
        others = [n for n in found.nodes if n.node_rank > 0 or n in failing]
        suspects = [n for n in others if n in failing or n not in began]
        missing = (world - joined) if world is not None and joined is not None else None
        if missing is None or suspects and sum(len(n.tp_ranks) for n in suspects) == missing:
            chosen = suspects
        elif sum(len(n.tp_ranks) for n in others) == missing:
            chosen = others
        else:
            chosen, unplaced = [], missing
        absent = [(n, n in began) for n in chosen]
    elif world is not None and joined is not None:
        unplaced = world - joined
    return Rendezvous(
        found,
        wait,
        int(wait[1]["secs"]) if wait else None,
        joined,
        world,
        tuple(connects),
        tuple(absent),
        unplaced,
    )


def store_rendezvous(bundle: Bundle) -> Diagnosis | None:
    """torch's store at ``--dist-init-addr`` timed out: node 0's rank 0 waited for the world
    (``K/W clients joined``), or a rank could not connect to it. Names the nodes whose ranks
    never joined (the count against the group's layout and which nodes' ranks began init) and
    the node that could not reach the address, with the address."""
    found = _rendezvous(bundle)
    return None if found is None else _rendezvous_diagnosis(bundle, found)


def _rendezvous_diagnosis(bundle: Bundle, found: Rendezvous) -> Diagnosis:
    addr = _dist_address(bundle)
    numbers: dict[str, float] = {"tp_size": bundle.tp()}
    if found.found is not None:
        numbers["nnodes"] = len(found.found.nodes)
    said: list[str] = []
    evidence: list[Evidence] = []
    connect = next((c for c in found.connects if c.seconds is not None), None) or (
        found.connects[0] if found.connects else None
    )
    if connect is not None:
        who = _label(connect.node) if connect.node is not None else "a rank"
        tried = f" for {connect.seconds:g} s" if connect.seconds is not None else ""
        why = next((c.why for c in found.connects if c.why), None)
        failed = f"connect {why}" if why else "connect timed out"
        said.append(
            f"{who} could not reach the distributed store at {connect.host}:{connect.port}"
            f"{tried} ({failed})"
        )
        numbers["store_port"] = connect.port
        if connect.seconds is not None:
            numbers["connect_timeout_s"] = connect.seconds
        evidence.append(bundle.evidence(connect.hit))
    if found.wait is not None:
        host = _host_node(found)
        at = f" at {addr[0]}:{addr[1]}" if addr and connect is None else ""
        said.append(
            f"the store on {host}{at} waited {found.seconds} s and only {found.joined} of the "
            f"{found.world} ranks joined"
        )
        numbers.update(
            clients_joined=found.joined or 0,
            world_size=found.world or 0,
            store_timeout_s=found.seconds or 0,
        )
        evidence.insert(0, bundle.evidence(found.wait))
    never = [(n, began) for n, began in found.absent if connect is None or n != connect.node]
    if never:
        parts = []
        for node, began in never:
            how = (
                "its ranks began distributed init but never reached the store (torch retries a "
                "refused connection without a word)"
                if began
                else "its ranks never began distributed init"
            )
            lost = _unreachable(node)
            parts.append(f"{_label(node)} never joined: {how}" + (f"; {lost}" if lost else ""))
        said.append("; ".join(parts))
    elif found.unplaced > 0:
        said.append(f"{found.unplaced} ranks never joined")
    nodes = f" over {len(found.found.nodes)} nodes" if found.found is not None else ""
    return Diagnosis(
        category="nccl-init-hang",
        summary=(
            "distributed init timed out at torch's store: "
            + "; ".join(said)
            + f" (TP {bundle.tp()}{nodes})"
        ),
        remedy=_store_remedy(found, connect, addr),
        evidence=evidence,
        numbers=numbers,
    )


def _host_node(found: Rendezvous) -> str:
    if found.found is None:
        return "global rank 0"
    node = found.found.nodes[0]
    return f"{node.name} (node 0)" if found.found.named else "node 0"


def _store_remedy(
    found: Rendezvous, connect: StoreConnect | None, addr: tuple[str, str] | None
) -> str:
    host, port = (connect.host, str(connect.port)) if connect else (addr or ("HOST", "PORT"))
    away = (connect.node if connect else None) or next((n for n, _ in found.absent), None)
    there = f" from {away.name}" if away is not None and found.found and found.found.named else ""
    check = f"nc -zv {host} {port}{there}"
    return (
        f"check that --dist-init-addr ({host}:{port}) is node 0's address on a network every "
        "node shares (a hostname can resolve to another address on another node) and the same "
        f"on every node, that port {port} is open between the nodes ({check}), and pin "
        "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME to that network's interface on every node; "
        "start every node's part within the timeout"
    )


# --- a rank that died during distributed init on one node ------------------------------------


@dataclass(frozen=True)
class InitDeath:
    """A rank that raised during distributed init (``raised``: its exception line; ``error``:
    the traceback's last line), its TP rank and node, and NCCL's failed connection on that node
    before it (``peer``), if any."""

    raised: Hit
    rank: int
    node: GroupNode | None
    error: Hit
    peer: Hit | None
    nodes: int


def _raised_error(bundle: Bundle, hit: Hit) -> Hit | None:
    """The traceback's last line after ``hit``, printed by the same node."""
    node = bundle.log.node(hit[0])
    for number in range(hit[0] + 1, min(hit[0] + 400, len(bundle.log.lines)) + 1):
        if bundle.log.node(number) != node:
            continue
        match = RAISED.match(bundle.log.lines[number - 1])
        if match is not None:
            return number, match
    return None


def _init_death(bundle: Bundle) -> InitDeath | None:
    if not bundle.log.find(RANK_RAISED):
        return None
    found = layout(bundle)
    if found is None or any(bundle.log.first(p) for p in (GLOO_LOOPBACK, LOOPBACK_REFUSED)):
        return None  # ranks on the loopback: ``nccl.gloo_loopback`` says why
    begins = bundle.log.find(DIST_BEGIN)
    for hit in bundle.log.find(RANK_RAISED):
        tags = RANK_TAG.findall(_prefix(bundle.log.lines[hit[0] - 1]))
        if not tags:
            continue
        rank, node = int(tags[-1]), node_of_line(bundle, found, hit[0])
        began = [n for n, _ in begins if n < hit[0] and node_of_line(bundle, found, n) == node]
        if not began:
            continue
        progressed = [
            n
            for n, _ in bundle.log.find(DIST_PROGRESS)
            if began[-1] < n < hit[0] and node_of_line(bundle, found, n) == node
        ]
        error = _raised_error(bundle, hit)
        if error is not None and "address already in use" in error[1]["what"].lower():
            continue  # a port taken: the port rules say whose
        if (
            progressed
            or error is None
            or not DISTRIBUTED_ERROR.search(error[1]["what"] + error[1]["type"])
        ):
            continue
        peers = [
            h
            for h in bundle.log.find(NCCL_CONNECT)
            if began[-1] < h[0] < hit[0] and node_of_line(bundle, found, h[0]) in (node, None)
        ]
        return InitDeath(hit, rank, node, error, peers[0] if peers else None, len(found.nodes))
    return None


def rank_died_in_init(bundle: Bundle) -> Diagnosis | None:
    """A rank of a multi-node launch raised during distributed init with a distributed error
    (NCCL, Gloo, the store): names the rank and its node (its line's tag, else the group's
    layout), and the peer NCCL could not reach on that node, with the node's own addresses when
    its snapshot lists them."""
    found = _init_death(bundle)
    return None if found is None else _init_death_diagnosis(bundle, found)


def _init_death_diagnosis(bundle: Bundle, found: InitDeath) -> Diagnosis:
    where = _label(found.node) if found.node is not None else "one node"
    numbers: dict[str, float] = {
        "failing_rank": found.rank,
        "tp_size": bundle.tp(),
        "nnodes": found.nodes,
    }
    error = found.error[1]
    summary = (
        f"TP{found.rank} on {where} died during distributed init: {error['type'].split('.')[-1]}: "
        f"{error['what'][:160]}"
    )
    evidence = [bundle.evidence(found.raised), bundle.evidence(found.error)]
    host = None
    if found.peer is not None:
        peer = found.peer[1]
        host, why = peer["host"], peer["why"] or peer["why2"]
        numbers["peer_port"] = int(peer["port"])
        summary += (
            f"; before it NCCL's bootstrap could not connect to {host}:{peer['port']} "
            f"({why.strip()})"
        )
        addr = _dist_address(bundle)
        if addr is not None and addr[0] == host:
            summary += ", node 0's --dist-init-addr host"
        if found.node is not None:
            summary += _no_address_on(found.node, host)
        evidence.insert(0, bundle.evidence(found.peer))
    summary += f" (TP {bundle.tp()} over {found.nodes} nodes)"
    node = (
        found.node.name
        if found.node is not None and not found.node.name.startswith("node rank")
        else "that node"
    )
    route = f"`ip route get {host}` on {node}" if host else f"`ip route` on {node}"
    return Diagnosis(
        category="nccl-init-hang",
        summary=summary,
        remedy=(
            "pin NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME on every node to the interface of a "
            f"network all the nodes share (check with {route}), and set --dist-init-addr to node "
            "0's address on that network; NCCL_DEBUG=INFO shows the interface NCCL chose on each "
            "node"
        ),
        evidence=evidence,
        numbers=numbers,
    )


def _no_address_on(node: GroupNode, host: str) -> str:
    """``; node-b has no address on 10.0.0.4's network (eth0 10.0.1.5/24)`` when the node's
    latest snapshot lists its interfaces and none is on that network; ``""`` otherwise."""
    try:
        target = ipaddress.ip_address(host)
    except ValueError:
        return ""
    for snapshot in reversed(node.snapshots):
        interfaces = (snapshot.get("network") or {}).get("interfaces") or []
        if not interfaces:
            continue
        held = []
        for interface in interfaces:
            try:
                network = ipaddress.ip_interface(str(interface.get("ipv4"))).network
            except ValueError:
                continue
            if target in network:
                return ""
            held.append(f"{interface.get('name')} {interface.get('ipv4')}")
        if held:
            return f"; {node.name} has no address on {host}'s network ({', '.join(held)})"
    return ""


# --- the nodes parted while serving ----------------------------------------------------------


@dataclass(frozen=True)
class Parted:
    """After the ready line: NCCL's watchdog lines (``watchdogs``), the nodes whose ranks
    reported it (``reporting``) and those that reported nothing (``silent``, with what their
    snapshot says of them)."""

    ready: Hit
    watchdogs: tuple[Hit, ...]
    reporting: tuple[GroupNode, ...]
    silent: tuple[tuple[GroupNode, str | None], ...]
    found: Layout


def _parted(bundle: Bundle) -> Parted | None:
    ready = bundle.log.first(SERVED)
    found = layout(bundle) if ready is not None else None
    if found is None or ready is None:
        return None
    watchdogs = [h for h in bundle.log.find(NCCL_WATCHDOG) if h[0] > ready[0]]
    lost = {n: _unreachable(n) for n in found.nodes}
    if not watchdogs and not any(lost.values()):
        return None
    if any(n > ready[0] for n, _ in bundle.log.find(RANK_ERROR_AFTER_READY)):
        return None  # a rank's own failure: the timeouts are its effect
    reporting = []
    for node in found.nodes:
        if any(node_of_line(bundle, found, n) == node for n, _ in watchdogs):
            reporting.append(node)
    silent = [(n, lost[n]) for n in found.nodes if n not in reporting]
    if watchdogs and not reporting:
        return None  # the watchdog lines cannot be placed on a node
    if not watchdogs:
        silent = [(n, why) for n, why in lost.items() if why]
    return Parted(ready, tuple(watchdogs), tuple(reporting), tuple(silent), found)


def parted_while_serving(bundle: Bundle) -> Diagnosis | None:
    """A multi-node server was ready, then a collective across the nodes stalled and NCCL's
    watchdog aborted the ranks (or the panel lost a node): the ranks of every node timed out on
    it (the traffic between the nodes stopped: a link), or some nodes reported nothing (those
    stopped: the node was lost). A rank's own error after ready is left to the other rules."""
    found = _parted(bundle)
    return None if found is None else _parted_diagnosis(bundle, found)


def _parted_diagnosis(bundle: Bundle, found: Parted) -> Diagnosis:
    tp, nodes = bundle.tp(), len(found.found.nodes)
    numbers: dict[str, float] = {"tp_size": tp, "nnodes": nodes, "ready_line": found.ready[0]}
    evidence = [bundle.evidence(found.ready)]
    what = ""
    if found.watchdogs:
        first = found.watchdogs[0][1]
        numbers.update(
            seq_num=int(first["seq"]),
            nccl_timeout_ms=int(first["timeout"]),
            ran_for_ms=int(first["ran"]),
        )
        evidence += [
            bundle.evidence(
                next(h for h in found.watchdogs if node_of_line(bundle, found.found, h[0]) == node)
            )
            for node in found.reporting
        ]
        what = (
            f"a NCCL {first['op']} across the nodes (SeqNum {first['seq']}) ran for "
            f"{first['ran']} ms against Timeout(ms)={first['timeout']}"
        )
    reporting = [_label(n) for n in found.reporting]
    if found.reporting and not found.silent:
        summary = (
            f"the server was ready (line {found.ready[0]}), then {what} and stalled on every "
            f"node: {_both(reporting)} each waited for it until NCCL's watchdog aborted the "
            "ranks — every node's ranks were alive and had entered the collective, so the data "
            f"between the nodes stopped (a dropped link or NIC) (TP {tp} over {nodes} nodes)"
        )
        remedy = (
            "restart the launch; check the link between the nodes: ibstat / ip -s link on the "
            "inter-node NIC of every node, dmesg for NIC or Xid errors on each, NCCL_DEBUG=INFO on "
            "the next run for the transport it used; raise --dist-timeout only if a rank is "
            "legitimately slow"
        )
    else:
        gone = [_label(node) + (f" ({why})" if why else "") for node, why in found.silent]
        seen = f" on {_both(reporting)}" if reporting else ""
        stalled = f"{what}{seen}; " if what else ""
        their = "its" if len(gone) == 1 else "their"
        lost = all(why for _, why in found.silent)
        summary = (
            f"the server was ready (line {found.ready[0]}), then {stalled}{_both(gone)} "
            f"reported nothing: {their} ranks stopped taking part — "
            + ("the node was lost mid-run" if lost else "a hung rank or a node cut off mid-run")
            + f" (TP {tp} over {nodes} nodes)"
        )
        names = _both([n.name for n, _ in found.silent])
        remedy = (
            f"check {names}: whether it is up (SSH, power, its kernel log), its GPUs "
            "(nvidia-smi, dmesg for Xid errors) and its inter-node NIC; restart the launch once "
            "it is back, or place the part on another node"
        )
    for node, _ in found.silent:
        if (why := _unreachable(node)) is not None:
            evidence.append(Evidence(f"[{node.name}] {why}", None, "snapshot"))
    return Diagnosis(
        category="health-check-failure",
        summary=summary,
        remedy=remedy,
        evidence=evidence,
        numbers=numbers,
    )


# --- any other diagnosis: which node its line came from --------------------------------------


def locate(bundle: Bundle, found: Diagnosis) -> Diagnosis:
    """``found`` on a multi-node bundle, with the node its first log line came from named when
    its summary names no node of the group; an ``unknown`` one with the first rank that raised,
    on its node. Unchanged on one node."""
    group = layout(bundle)
    if group is None or not group.named:
        return found
    if any(node.name in found.summary for node in group.nodes):
        return found
    if found.category == "unknown":
        return _first_failure(bundle, group, found)
    said = _where_from(bundle, group, found)
    return replace(found, summary=f"{found.summary}; {said}") if said else found


def _where_from(bundle: Bundle, group: Layout, found: Diagnosis) -> str:
    """Which node each evidence line came from: ``line 2 is from node-b (node rank 1,
    TP8–TP15)``; a snapshot fact of another node (``[node-b] …``) says its node. The ready line
    (node 0's, never the failure) is left out."""
    lines: dict[GroupNode, list[int]] = {}
    for item in found.evidence:
        if item.line is None or SERVED.search(bundle.log.lines[item.line - 1]):
            continue
        node = node_of_line(bundle, group, item.line)
        if node is not None:
            lines.setdefault(node, []).append(item.line)
    said = [
        (
            f"line {numbers[0]} is"
            if len(numbers) == 1
            else f"lines {_both(list(map(str, numbers)))} are"
        )
        + f" from {_label(node)}"
        for node, numbers in lines.items()
    ]
    facts = {
        node
        for item in found.evidence
        if item.line is None
        for node in group.nodes
        if item.text.startswith(f"[{node.name}] ")
    }
    said += [f"the snapshot facts are from {_label(node)}" for node in group.nodes if node in facts]
    return "; ".join(said)


def _first_failure(bundle: Bundle, group: Layout, found: Diagnosis) -> Diagnosis:
    hit = bundle.log.first(RANK_RAISED)
    if hit is None:
        return found
    node = node_of_line(bundle, group, hit[0])
    tags = RANK_TAG.findall(_prefix(bundle.log.lines[hit[0] - 1]))
    error = _raised_error(bundle, hit)
    if node is None or not tags:
        return found
    said = f": {error[1]['type'].split('.')[-1]}: {error[1]['what'][:160]}" if error else ""
    evidence = [bundle.evidence(hit)] + ([bundle.evidence(error)] if error else [])
    return replace(
        found,
        summary=(
            f"{found.summary}; the first rank to fail was TP{tags[-1]} on {_label(node)}{said}"
        ),
        evidence=evidence + list(found.evidence),
    )


#: The line that alone shows each rule's failure, whatever its figures say (engine._unreadable).
RECOGNISES: dict[Rule, tuple[str, re.Pattern[str]]] = {
    store_rendezvous: ("nccl-init-hang", re.compile(r"waiting for (?:clients|workers)\.")),
}
