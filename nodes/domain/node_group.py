"""One server over several nodes: what each node runs, from one revision, and where the nodes
meet (issue 22). Plain arithmetic over what the nodes reported; nothing here reaches a node.

SGLang's multi-node launch (shared/reference/sglang.md §1b): every node runs the same flags with
its own ``--node-rank R`` (0 … nnodes − 1) and the same ``--dist-init-addr HOST:PORT``, node 0's
address, where node 0's first rank serves the distributed store the others join
(``init_distributed_environment(distributed_init_method=f"tcp://{dist_init_addr}")``). Each node
runs tp × pp / nnodes ranks ("tp_size must be divisible by number of nodes"); node R holds the
TP ranks R × per … (R + 1) × per − 1. Nodes of rank ≥ 1 run no tokenizer and serve a dummy
``/health`` on ``--port`` that always answers 200, so every node needs the HTTP port; only node 0
serves requests. NCCL and Gloo pick their interface from ``NCCL_SOCKET_IFNAME`` /
``GLOO_SOCKET_IFNAME`` when set (NCCL's environment documentation), else one of their own choice,
and SGLang's own address from ``SGLANG_HOST_IP``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field

from nodes.domain.launch_plan import Check, PlanError, nodes_needed, ranks_needed, server_port
from nodes.domain.sglang_flags import ParsedCommand, address_port

#: The store's port when the revision names none: SGLang's documentation's examples use 5000
#: (``--dist-init-addr 10.0.0.1:5000``); the launch reserves it on node 0 like any other port.
DEFAULT_DIST_PORT = 5000
#: The variables that pin the interface collective traffic uses, in the order they are checked.
INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


@dataclass(frozen=True)
class Interface:
    """One network interface of a node as its probe read it: ``name`` (``eth0``) and ``address``
    with its prefix length (``10.0.0.2/24``, IPv4 or IPv6)."""

    name: str
    address: str

    @property
    def parsed(self) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
        return ipaddress.ip_interface(self.address)

    @property
    def loopback(self) -> bool:
        return self.parsed.is_loopback


@dataclass(frozen=True)
class GroupNode:
    """A node of the group, in rank order: its inventory name and its interfaces."""

    name: str
    interfaces: tuple[Interface, ...]


@dataclass
class Meeting:
    """Where the nodes meet: node 0's ``host`` on the network every node has an address in,
    the store's ``port``, the interface each node's collectives will use (node name → interface
    name) and warnings worth a look before starting (loopback, another subnet)."""

    host: str
    port: int
    interfaces: dict[str, str]
    warnings: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def ranks_per_node(flags: ParsedCommand, nodes: int) -> int:
    """tp × pp / nnodes for a group of ``nodes``. Raises ``PlanError`` when the command's
    ``--nnodes`` is not the group's size or does not divide tp × pp."""
    nnodes = nodes_needed(flags)
    if nnodes != nodes:
        raise PlanError(
            f"the command says --nnodes {nnodes} but the launch names {nodes} node(s): "
            "list one node per --nnodes, in rank order"
        )
    if nodes < 2:
        raise PlanError("a node group has at least two nodes")
    return ranks_needed(flags)


def tp_ranks(flags: ParsedCommand, nodes: int, node_rank: int) -> range:
    """The TP ranks node ``node_rank`` runs (SGLang's ``tp_rank_range``)."""
    per = ranks_per_node(flags, nodes)
    return range(per * node_rank, per * (node_rank + 1))


def dist_port(flags: ParsedCommand) -> int:
    """The store's port: the one the revision's ``--dist-init-addr`` names, else
    ``DEFAULT_DIST_PORT``."""
    given = address_port(str(flags.get("dist_init_addr") or ""))
    return int(given) if given is not None else DEFAULT_DIST_PORT


def node_ports(flags: ParsedCommand, node_rank: int) -> list[int]:
    """The ports a node of the group must have free: every node binds ``--port`` (node 0 the
    server, the others the dummy ``/health``); node 0 also the store's port and the ports SGLang
    derives from it (with DP attention its ZMQ sockets take the store's port + 1 … + 4 + dp)."""
    if node_rank:
        return [server_port(flags)]
    store = dist_port(flags)
    ports = {server_port(flags), store}
    if flags.get("nccl_port"):
        ports.add(int(flags.get("nccl_port")))
    if flags.get("enable_dp_attention", default=False):
        dp = int(flags.get("dp_size", "data_parallel_size", default=1))
        ports |= set(range(store + 1, store + 5 + dp))
    return sorted(ports)


def meeting(flags: ParsedCommand, nodes: Sequence[GroupNode], env: dict[str, str]) -> Meeting:
    """Node 0's address on the first of its networks (in the order its probe listed them) that
    every node has an address in; with ``NCCL_SOCKET_IFNAME`` or ``GLOO_SOCKET_IFNAME`` in the
    launch's environment, that interface's network instead. Raises ``PlanError`` when the nodes
    share no network, or a node lacks the interface the environment names."""
    if len(nodes) < 2:
        raise PlanError("a node group has at least two nodes")
    if any(env.get(v) for v in INTERFACE_VARIABLES):
        return _pinned(flags, nodes, env)
    first, rest = nodes[0], nodes[1:]
    for own in first.interfaces:
        if own.loopback:
            continue
        network = own.parsed.network
        chosen = {first.name: own.name}
        for node in rest:
            match = next((i for i in node.interfaces if i.parsed.ip in network), None)
            if match is None:
                break
            chosen[node.name] = match.name
        else:
            return Meeting(str(own.parsed.ip), dist_port(flags), chosen)
    listed = "; ".join(
        f"{n.name}: " + (", ".join(f"{i.name} {i.address}" for i in n.interfaces) or "none")
        for n in nodes
    )
    raise PlanError(
        f"the nodes share no network: no address of {first.name} (node 0) is in a subnet every "
        f"other node has an address in ({listed})"
    )


def given_meeting(flags: ParsedCommand, nodes: Sequence[GroupNode]) -> Meeting | None:
    """Where the revision's own ``--dist-init-addr`` makes the nodes meet (None when it names
    none): it must be one of node 0's addresses, where node 0's first rank serves the store; a
    host name passes with a warning (each node resolves it itself). Each node's interface is its
    address in that network, with a warning for a node that has none. Raises ``PlanError``."""
    text = str(flags.get("dist_init_addr") or "")
    if not text or address_port(text) is None:
        return None
    host = text.rpartition(":")[0].strip("[]")
    port = dist_port(flags)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return Meeting(
            host,
            port,
            {},
            [
                f"--dist-init-addr names the host {host}: every node resolves it itself, so "
                f"check it is {nodes[0].name} (node 0) on a network every node shares"
            ],
        )
    own = next((i for i in nodes[0].interfaces if i.parsed.ip == ip), None)
    if own is None:
        have = ", ".join(f"{i.name} {i.address}" for i in nodes[0].interfaces) or "none"
        raise PlanError(
            f"--dist-init-addr {text} is not an address of {nodes[0].name} (node 0), whose first "
            f"rank serves the store there; its addresses: {have}"
        )
    chosen, warnings = {nodes[0].name: own.name}, []
    if own.loopback:
        warnings.append(f"{host} is a loopback address: other nodes cannot reach it")
    for node in nodes[1:]:
        match = next((i for i in node.interfaces if i.parsed.ip in own.parsed.network), None)
        if match is None:
            warnings.append(
                f"{node.name} has no address in {own.parsed.network}: its ranks reach {host} "
                "only if something routes between the two"
            )
        else:
            chosen[node.name] = match.name
    return Meeting(str(ip), port, chosen, warnings)


def interface_matches(spec: str, name: str, *, exact: bool = False) -> bool:
    """Whether interface ``name`` is one that ``spec`` lets the collectives use: NCCL's
    ``NCCL_SOCKET_IFNAME`` syntax (misc/socket.cc ``findInterfaces``; NCCL's environment
    documentation): names separated by commas, each a prefix (``eth`` is ``eth0``, ``eth1``…),
    exact after a leading ``=``, excluded after a leading ``^``; ``host:port`` entries are matched
    by their name. ``exact`` for Gloo's ``GLOO_SOCKET_IFNAME``, whose names are exact."""
    spec = spec.strip()
    excluded = spec.startswith("^")
    spec = spec[1:] if excluded else spec
    if spec.startswith("="):
        spec, exact = spec[1:], True
    names = [part.split(":")[0] for part in spec.split(",") if part]
    hit = any(name == part if exact else name.startswith(part) for part in names)
    return hit != excluded


def _pinned(flags: ParsedCommand, nodes: Sequence[GroupNode], env: dict[str, str]) -> Meeting:
    """Every node's collectives use the interfaces the environment names (both variables where
    both are set): node 0's address on the first of them (not loopback) is the meeting point."""
    specs = [
        (variable, env[variable], variable.startswith("GLOO"))
        for variable in INTERFACE_VARIABLES
        if env.get(variable)
    ]
    usable: dict[str, list[Interface]] = {}
    for node in nodes:
        have = ", ".join(dict.fromkeys(i.name for i in node.interfaces)) or "none"
        left = list(node.interfaces)
        for variable, spec, exact in specs:
            if not any(interface_matches(spec, i.name, exact=exact) for i in node.interfaces):
                raise PlanError(
                    f"{node.name} has no interface that {variable}={spec[:64]} names (the "
                    f"launch's environment pins its collectives to it); its interfaces: {have}"
                )
            left = [i for i in left if interface_matches(spec, i.name, exact=exact)]
        if not left:
            raise PlanError(
                f"{node.name} has no interface that every one of "
                + ", ".join(f"{v}={s[:64]}" for v, s, _ in specs)
                + f" names; its interfaces: {have}"
            )
        usable[node.name] = left
    first = nodes[0]
    own = next((i for i in usable[first.name] if not i.loopback), usable[first.name][0])
    warnings = []
    if own.loopback:
        warnings.append(
            f"{own.name} is a loopback interface: other nodes cannot reach {first.name} on it"
        )
    network = own.parsed.network
    chosen = {first.name: own.name}
    for node in nodes[1:]:
        other = next((i for i in usable[node.name] if i.parsed.ip in network), None)
        if other is None:
            other = usable[node.name][0]
            warnings.append(
                f"{node.name}'s {other.name} ({other.address}) is not in {first.name}'s subnet "
                f"{network}: its ranks reach node 0 only if something routes between the two"
            )
        chosen[node.name] = other.name
    return Meeting(str(own.parsed.ip), dist_port(flags), chosen, warnings)


def fallback_meeting(flags: ParsedCommand, nodes: Sequence[GroupNode]) -> Meeting | None:
    """Node 0's first address that is not loopback, for a launch whose ``network`` check was
    overridden (the operator knows a route the addresses do not show); None without one."""
    own = next((i for i in nodes[0].interfaces if not i.loopback), None)
    if own is None:
        return None
    warning = f"the network check was overridden: the nodes meet at {nodes[0].name}'s {own.name}"
    return Meeting(str(own.parsed.ip), dist_port(flags), {nodes[0].name: own.name}, [warning])


def node_args(args: Sequence[str], node_rank: int, meeting_point: Meeting | str) -> list[str]:
    """The revision's flags for one node: ``--node-rank`` and ``--dist-init-addr`` (a
    ``Meeting`` or its ``HOST:PORT``) appended (the last one wins, as in argparse), so every node
    runs the same flags but these two."""
    address = meeting_point.address if isinstance(meeting_point, Meeting) else meeting_point
    return [*args, "--node-rank", str(node_rank), "--dist-init-addr", address]


# --- the group's own pre-flight checks (beside each node's) --------------------------------------


def check_versions(versions: Sequence[tuple[str, str | None]]) -> Check:
    """Every node (``(name, SGLang version)`` in rank order) runs node 0's SGLang: SGLang
    compares no version between nodes, so a mismatch shows only as ranks that never agree."""
    first_name, first = versions[0]
    other = [(n, v) for n, v in versions[1:] if v != first]
    if not other:
        return Check("sglang", True, f"every node runs SGLang {first}")
    name, version = other[0]
    listed = ", ".join(f"{n} {v or 'none found'}" for n, v in versions)
    return Check(
        "sglang",
        False,
        f"{name} runs SGLang {version or '(none found)'} but {first_name} (node 0) runs {first}: "
        f"every node must run the same version ({listed})",
        node=name,
    )


def check_same_model(model_path: str, configs: Sequence[tuple[str, str | None]]) -> Check:
    """Every node's ``config.json`` at ``model_path`` is node 0's (``(name, config hash)`` in rank
    order; None where it was not read); a node without it is the node's own ``model_path``."""
    first_name, first = configs[0]
    differs = [n for n, h in configs[1:] if h is not None and first is not None and h != first]
    if differs:
        return Check(
            "model_path",
            False,
            f"{model_path}/config.json on {differs[0]} differs from {first_name}'s (node 0): "
            "every node must serve the same model",
            node=differs[0],
        )
    return Check("model_path", True, f"{model_path}: the same config.json on every node read")


def check_network(
    flags: ParsedCommand, nodes: Sequence[GroupNode], env: dict[str, str]
) -> tuple[Check, Meeting | None]:
    """Where the nodes meet, as a check: the address and each node's interface, with the
    meeting's warnings; failed when they share no network (``meeting``'s reason)."""
    try:
        found = given_meeting(flags, nodes) or meeting(flags, nodes, env)
    except PlanError as exc:
        return Check("network", False, str(exc)), None
    used = ", ".join(f"{n} {i}" for n, i in found.interfaces.items())
    detail = f"the nodes meet at {found.address} (node 0's address); interfaces: {used}"
    if found.warnings:
        detail += "; warning: " + "; ".join(found.warnings)
    return Check("network", True, detail), found


def check_reach(node: str, address: str, reached: bool, error: str | None) -> Check:
    """``node`` reached (or not) the store's ``address`` on node 0, as tried from ``node``."""
    if reached:
        return Check("dist_init", True, f"{node} reaches {address}", node=node)
    return Check(
        "dist_init",
        False,
        f"{node} cannot reach {address} (node 0's --dist-init-addr): {error or 'no answer'}; its "
        "ranks would wait for node 0 until the init timeout",
        node=node,
    )
