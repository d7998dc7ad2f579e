"""Rules for ports a launch could not get: SGLang waited for one, or a bind found it in use."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from nodes.domain.diagnosis.evidence import Bundle, Diagnosis, Evidence, Hit, Rule
from nodes.domain.diagnosis.host_pools import _hicache_risk

PORT_WAIT = re.compile(
    r"(?P<name>\w+_port) at (?P<port>\d+) is not available in (?P<wait>\d+) seconds"
)


def _port_holder(
    bundle: Bundle, port: int
) -> tuple[str, dict[str, float], list[Evidence], list[str]]:
    """Who holds ``port`` in the latest snapshot that says: the listener, else an SGLang
    process; one re-parented to PID 1 is a leftover of an earlier launch."""
    numbers: dict[str, float] = {}
    holder, evidence, secondary = "", [], []
    for snapshot in reversed(bundle.snapshots()):
        owners = [p for p in snapshot.get("listening_ports") or [] if p.get("port") == port]
        processes = {p.get("pid"): p for p in snapshot.get("processes") or []}
        candidates = [o.get("pid") for o in owners] or [
            pid for pid, p in processes.items() if "sglang" in str(p.get("cmdline", ""))
        ]
        if candidates and candidates[0] is not None:
            pid = int(candidates[0])
            process = processes.get(pid, {})
            numbers["holder_pid"] = pid
            holder = f" by PID {pid}"
            if process:
                holder += f" ({process.get('cmdline')}, PPID {process.get('ppid')}"
                if process.get("elapsed_s"):
                    holder += f", running {process['elapsed_s']} s"
                holder += ")"
                evidence.append(Evidence(f"PID {pid}: {process.get('cmdline')}", None, "snapshot"))
                if process.get("ppid") == 1 and "sglang" in str(process.get("cmdline")):
                    secondary = ["defunct-zombie-process"]
                    holder += ", an SGLang process of an earlier launch left behind"
            dead = [
                p
                for p in processes.values()
                if p.get("ppid") == pid and str(p.get("state") or "").startswith("Z")
            ]
            if dead:
                secondary = ["defunct-zombie-process"]
                numbers["defunct_children"] = len(dead)
                holder += (
                    f"; its {len(dead)} children ({dead[0].get('cmdline') or '?'} …) are "
                    f"defunct: a server of an earlier launch that stopped serving but still "
                    f"holds the port"
                )
            break
    return holder, numbers, evidence, secondary


def port_in_use(bundle: Bundle) -> Diagnosis | None:
    """SGLang waited for a port it needs (``wait_port_available``, §6); the snapshot says who
    holds it."""
    hit = bundle.log.first(PORT_WAIT)
    if hit is None:
        return None
    name, port, wait = hit[1]["name"], int(hit[1]["port"]), int(hit[1]["wait"])
    holder, numbers, evidence, secondary = _port_holder(bundle, port)
    numbers = {"port": port, "wait_seconds": wait, **numbers}
    return Diagnosis(
        category="port-in-use",
        secondary_categories=secondary,
        summary=(
            f"port {port} ({name}) was still held{holder}; SGLang waited {wait} seconds for it"
        ),
        remedy=(
            "kill the leftover sglang process holding the port (kill by process group: "
            "kill -TERM -<pgid>, not by name), clean up before relaunch, or choose another port"
        ),
        evidence=[bundle.evidence(hit), *evidence],
        numbers=numbers,
    )


BIND_IN_USE = re.compile(
    r"ZMQError: Address already in use(?: \(addr='(?P<addr>[^']*?):(?P<port>\d+)'\))?|"
    r"\[Errno 98\] (?:error while attempting to bind on address \('(?P<host>[^']*)', "
    r"(?P<port2>\d+)\): )?[Aa]ddress already in use"
)


#: With DP attention on one node SGLang's ZMQ sockets are TCP from --port + 233 (§1b).
ZMQ_TCP_PORT_DELTA = 233


@dataclass(frozen=True)
class BindInUse:
    """A bind that found its address in use: ``zmq`` (else the HTTP server), the address and
    port it names (0: none named), the command's ``--port`` (``base``, as set), and the port's
    offset from it when it lies in the block SGLang derives from ``--port``."""

    hit: Hit
    zmq: bool
    where: str | None
    port: int
    base: Any
    offset: int | None


def _bind_in_use(bundle: Bundle) -> BindInUse | None:
    hit = bundle.log.first(BIND_IN_USE)
    if hit is None:
        return None
    match = hit[1]
    port = int(match["port"] or match["port2"] or 0)
    base = bundle.setting("port")
    offset = None
    if port and isinstance(base, int) and 0 < port - base < 1000:
        offset = port - base
    return BindInUse(hit, "ZMQ" in match[0], match["addr"] or match["host"], port, base, offset)


def port_bind_in_use(bundle: Bundle) -> Diagnosis | None:
    """A bind failed with ``Address already in use``: a ZMQ socket of SGLang (its ports are
    derived from ``--port``, §1b) or the HTTP server (uvicorn, §6). Co-located servers whose
    ``--port`` values are close claim overlapping derived blocks."""
    found = _bind_in_use(bundle)
    return None if found is None else _bind_in_use_diagnosis(bundle, found)


def _bind_in_use_diagnosis(bundle: Bundle, found: BindInUse) -> Diagnosis:
    port, base = found.port, found.base
    numbers: dict[str, float] = {"colliding_port": port} if port else {}
    derived = ""
    if found.offset is not None:
        numbers.update(port=base, offset_from_port=found.offset)
        derived = (
            f"; {port} = --port {base} + {found.offset}, inside the block SGLang derives from "
            f"--port (ZMQ/NCCL/metrics ports; TCP from --port + {ZMQ_TCP_PORT_DELTA} with DP "
            "attention), which a co-located server with a nearby --port overlaps"
        )
    holder, held, evidence, secondary = _port_holder(bundle, port) if port else ("", {}, [], [])
    numbers.update(held)
    behind = hicache = ""
    if (risk := _hicache_risk(bundle)) is not None:
        text, figures, pool_lines = risk
        numbers.update(figures)
        secondary = secondary + ["host-oom-hicache"]
        behind = f"; behind it, {text}"
        evidence += pool_lines
        hicache = (
            "; set --hicache-size to an absolute GB per rank (it overrides --hicache-ratio) so the "
            "pinned host pools of all co-located servers fit the host"
        )
    sibling, sibling_fix = _other_vllm_server(bundle, numbers) if found.zmq else ("", "")
    holder += sibling
    what = f"{'ZMQ' if found.zmq else 'HTTP'} bind to {found.where or '?'}:{port or '?'}"
    spaced = f" (e.g. ports {base}/{base + 1000})" if isinstance(base, int) else ""
    return Diagnosis(
        category="port-in-use",
        secondary_categories=secondary,
        summary=f"{what} failed: address already in use{holder}{derived}{behind}",
        remedy=_bind_remedy(numbers, spaced, hicache, sibling_fix),
        evidence=[bundle.evidence(found.hit), *evidence],
        numbers=numbers,
    )


def _bind_remedy(numbers: dict[str, float], spaced: str, hicache: str, sibling: str) -> str:
    """What frees the port: a distinct internal port for a sibling server, else spacing the
    servers' --port apart or stopping the holder (with its defunct children, if any)."""
    if sibling:
        return sibling.lstrip("; ") + "; or start the second instance after the first is ready"
    fix = (
        f"space --port of co-located servers at least 1000 apart{spaced} and give each its "
        "own kv-events/metrics ports, or stop the process holding the port"
    )
    if "defunct_children" in numbers:
        fix += (
            f" (kill the earlier launcher PID {numbers['holder_pid']:g} and its process group, "
            "kill -TERM -<pgid>; its defunct children go with it), or choose another port"
        )
    elif "holder_pid" in numbers:
        fix += f" (PID {numbers['holder_pid']:g}), or choose another port"
    return fix + hicache


SERVER_PORT = re.compile(r"--port[ =](?P<port>\d+)")


def _other_vllm_server(bundle: Bundle, numbers: dict[str, float]) -> tuple[str, str]:
    """vLLM: the ZMQ port's holder belongs to another vLLM server on the node (itself or its
    parent), which uses the same internal RPC port (VLLM_RPC_PORT, a fixed default) whatever
    its --port; in words, with the fix. Empty when the snapshot does not show that."""
    pid = numbers.get("holder_pid")
    if not bundle.vllm or pid is None:
        return "", ""
    processes = {p.get("pid"): p for s in bundle.snapshots() for p in s.get("processes") or []}
    holder = processes.get(int(pid)) or {}
    server = holder if "vllm" in str(holder.get("cmdline")) else processes.get(holder.get("ppid"))
    if not server or "vllm" not in str(server.get("cmdline")):
        return "", ""
    theirs = SERVER_PORT.search(str(server.get("cmdline")))
    ours = bundle.engine_value("port")
    child = "a child of " if server is not holder else ""
    said = f"; it is {child}PID {server.get('pid')}, another vLLM server"
    if theirs is not None:
        numbers["other_instance_http_port"] = int(theirs["port"])
        said += f" (--port {theirs['port']}"
        if ours and ours.isdigit():
            numbers["http_port"] = int(ours)
            said += f"; this one --port {ours}"
        said += ")"
    started = _elapsed_before_launch(bundle, server.get("pid"))
    if started is not None:
        numbers["start_delay_s"] = started
        said += f", started {started} s before this launch"
    said += ": both use vLLM's internal RPC port (VLLM_RPC_PORT), whatever their --port"
    return (
        said,
        "; set a distinct VLLM_RPC_PORT per instance (or upgrade vLLM, which uses IPC paths)",
    )


def _elapsed_before_launch(bundle: Bundle, pid: Any) -> int | None:
    """How long ``pid`` had run when the launch began (its ``elapsed_s`` before the launch)."""
    for snapshot in bundle.snapshots():
        if snapshot.get("phase") != "before_launch":
            continue
        for row in snapshot.get("processes") or []:
            if row.get("pid") == pid and isinstance(row.get("elapsed_s"), int):
                return int(row["elapsed_s"])
    return None


# torch.distributed's TCPStore (c10d/socket.cpp) could not listen on its port: another socket
# has it. With nothing listening before or after the launch, the port was taken in between
# (an ephemeral source port of some connection, or a sibling rank's probe).
STORE_IN_USE = re.compile(
    r"server socket has failed to listen on any local network address\. port: (?P<port>\d+)"
    r".*?EADDRINUSE|DistNetworkError: .*?port: (?P<port2>\d+).*?address already in use"
)
EPHEMERAL_NOTE = re.compile(r"ip_local_port_range\D*(?P<low>\d+)\s+(?P<high>\d+)")


def dist_store_in_use(bundle: Bundle) -> Diagnosis | None:
    """The distributed store's port (``--dist-init-addr``, ``--nccl-port`` or one SGLang
    picked) was taken when a rank came to bind it."""
    hit = bundle.log.first(STORE_IN_USE)
    if hit is None:
        return None
    port = int(hit[1]["port"] or hit[1]["port2"])
    numbers: dict[str, float] = {"failed_port": port}
    said = f"the torch.distributed store could not bind port {port} (EADDRINUSE)"
    dp = bundle.count("dp_size", default=0) or int(bundle.engine_number("data_parallel_size") or 0)
    if dp > 1:
        numbers["dp_size"] = dp
        said += f"; with --dp {dp} each DP rank picks its own dist-init port"
    holder = _holder_of(bundle, port)
    ephemeral = bundle.note_match(EPHEMERAL_NOTE)
    if holder is not None:
        numbers["holder_pid"] = holder
        said += f"; PID {holder} listens on it"
    elif ephemeral is not None:
        low, high = int(ephemeral["low"]), int(ephemeral["high"])
        numbers.update(ephemeral_port_low=low, ephemeral_port_high=high)
        if low <= port <= high:
            said += (
                f"; nothing held it before or after, and it lies in the kernel's ephemeral "
                f"range ({low} to {high}): another connection took it between the probe and the "
                "bind (a race, not a leftover process)"
            )
    return Diagnosis(
        category="port-in-use",
        summary=said,
        remedy=(
            "choose --port/--nccl-port outside the ephemeral range (ip_local_port_range), or "
            "reserve the block with net.ipv4.ip_local_reserved_ports; retry the launch if it was "
            "a race; stop the holder if one still listens"
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


def _holder_of(bundle: Bundle, port: int) -> int | None:
    """The PID the latest snapshot shows listening on ``port``, if any."""
    for snapshot in reversed(bundle.snapshots()):
        for row in snapshot.get("listening_ports") or []:
            if row.get("port") == port and row.get("pid"):
                return int(row["pid"])
    return None


#: The line that alone shows each rule's failure, whatever its figures say (engine._unreadable).
RECOGNISES: dict[Rule, tuple[str, re.Pattern[str]]] = {
    port_in_use: ("port-in-use", PORT_WAIT),
    port_bind_in_use: ("port-in-use", BIND_IN_USE),
    dist_store_in_use: ("port-in-use", re.compile(r"EADDRINUSE")),
}
