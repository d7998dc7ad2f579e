"""Rules for NCCL between the ranks: /dev/shm too small for its segments, a distributed init that
hung."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from nodes.domain.diagnosis.evidence import LOAD_END, Bundle, Diagnosis, Hit, Rule, _num, _when
from nodes.domain.diagnosis.runtime import NCCL_WATCHDOG, SERVED

# NCCL's shm transport (src/transport/shm.cc, misc/shmutils.cc): creating a segment, or
# growing it with fallocate/ftruncate, fails when /dev/shm is full.
SHM_SEGMENT = re.compile(
    r"Error while creating shared memory segment /dev/shm/nccl-\S* \(size (?P<size>\d+)\)|"
    r"failed to extend /dev/shm/nccl-\S* to (?P<size2>\d+) bytes"
)


def nccl_shm(bundle: Bundle) -> Diagnosis | None:
    """NCCL could not create its shared-memory segment: /dev/shm is too small (Docker's
    default is 64 MB)."""
    hit = bundle.log.first(SHM_SEGMENT)
    if hit is None:
        return None
    segment = int(hit[1]["size"] or hit[1]["size2"])
    tp = bundle.tp()
    numbers: dict[str, float] = {"tp_size": tp, "nccl_segment_bytes": segment}
    size = ""
    if shm_bytes := _shm_bytes(bundle):
        # The corpus's key (C23) says MB for what Docker's --shm-size 64m gives: 64 MiB.
        numbers["shm_size_mb"] = round(shm_bytes / 2**20)
        size = f" is only {numbers['shm_size_mb']:g} MiB"
    numbers["recommended_shm_gb"] = 16
    return Diagnosis(
        category="nccl-shm",
        summary=(
            f"/dev/shm{size}: NCCL cannot create its {segment / 1e6:.1f} MB ({segment} bytes) "
            f"shared-memory segments between the {tp} TP ranks (16 GB recommended)"
        ),
        remedy=(
            "give the container a larger /dev/shm: docker run --shm-size 16g (or --ipc=host); "
            "in Kubernetes an emptyDir with medium: Memory and a sizeLimit mounted at /dev/shm"
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


def _shm_bytes(bundle: Bundle) -> int | None:
    """The size of /dev/shm in bytes in the latest snapshot that has it; ``None`` without."""
    for snapshot in reversed(bundle.snapshots()):
        size = (snapshot.get("shm") or {}).get("size_bytes")
        if size:
            return int(size)
    return None


DIST_BEGIN = re.compile(r"Init torch distributed begin")


# Progress past distributed init, or a Python error (then it is not a hang).
DIST_PROGRESS_OR_ERROR = re.compile(
    r"Init torch distributed ends|Load weight begin|Scheduler hit an exception|Traceback"
)


RANK_DIED = re.compile(
    r"[Rr]ank (?P<rank>\d+) [Ss]cheduler (?:died|is dead)(?:.*?[Ee]xit code: (?P<code>-?\d+))?"
)


EXIT_CODE = re.compile(r"Exit code: (?P<code>-?\d+)")


NCCL_COMPLETE = re.compile(r"NCCL INFO .*Init COMPLETE|spans across nodes")


def _fabric(bundle: Bundle) -> tuple[str, str, dict[str, str]] | None:
    """The interface that reaches ``--dist-init-addr`` (node 0's ``host:port``, §1b) when it is
    not the default-route one, whose address a process picks for itself unless told
    (``SGLANG_HOST_IP``): (that interface, the address, the default-route interface)."""
    addr = str(bundle.setting("dist_init_addr") or "").rsplit(":", 1)[0]
    try:
        target = ipaddress.ip_address(addr)
    except ValueError:
        return None
    for snapshot in reversed(bundle.snapshots()):
        interfaces = (snapshot.get("network") or {}).get("interfaces") or []
        default = next((i for i in interfaces if i.get("default_route")), None)
        for interface in interfaces:
            try:
                network = ipaddress.ip_interface(str(interface.get("ipv4"))).network
            except ValueError:
                continue
            if target in network and default is not None and default is not interface:
                return (
                    str(interface.get("name")),
                    addr,
                    {
                        "name": str(default.get("name")),
                        "ipv4": str(default.get("ipv4")),
                    },
                )
    return None


@dataclass(frozen=True)
class InitHang:
    """Distributed init that began (``begin``: the last ``Init torch distributed begin``) and
    made no progress until a rank was found dead (``died``): the exit code as logged, the nodes
    and TP size, NCCL's own ``Init COMPLETE`` after the begin, the seconds from the last
    prefixed line to the death, the fabric interface when it is not the default-route one
    (``_fabric``, multi-node only), and whether SGLANG_HOST_IP is set."""

    begin: Hit
    died: Hit
    code: str | None
    nodes: int
    tp: int
    nccl: Hit | None
    waited_s: int | None
    fabric: tuple[str, str, dict[str, str]] | None
    host_ip_set: bool


def _exit_code(bundle: Bundle, died: Hit) -> str | None:
    """The dead rank's exit code: on its line, else on an ``Exit code:`` line just after."""
    code: str | None = died[1]["code"]
    if code is None:
        after = [m for n, m in bundle.log.find(EXIT_CODE) if died[0] <= n <= died[0] + 2]
        code = after[0]["code"] if after else None
    return code


def _hang_seconds(bundle: Bundle, died: Hit) -> int | None:
    """Seconds from the last line with a time before the death to the death's own time."""
    end = _when(bundle.log.lines[died[0] - 1])
    last = next(
        (t for t in map(_when, reversed(bundle.log.lines[: died[0] - 1])) if t is not None), None
    )
    return int((end - last).total_seconds()) if end is not None and last is not None else None


def _init_hang(bundle: Bundle) -> InitHang | None:
    begins = bundle.log.find(DIST_BEGIN)
    died = bundle.log.first(RANK_DIED)
    if not begins or died is None or died[0] < begins[-1][0]:
        return None
    if any(begins[-1][0] < n < died[0] for n, _ in bundle.log.find(DIST_PROGRESS_OR_ERROR)):
        return None
    nodes = bundle.count("nnodes", default=max(1, int(bundle.facts.get("nodes_in_launch") or 1)))
    nccl = [h for h in bundle.log.find(NCCL_COMPLETE) if h[0] > begins[-1][0]]
    env = bundle.facts.get("env") or {}
    return InitHang(
        begins[-1],
        died,
        _exit_code(bundle, died),
        nodes,
        bundle.tp(),
        nccl[-1] if nccl else None,
        _hang_seconds(bundle, died),
        _fabric(bundle) if nodes > 1 else None,
        bool(env.get("SGLANG_HOST_IP")),
    )


def nccl_init_hang(bundle: Bundle) -> Diagnosis | None:
    """Distributed init began but never ended (no ``Init torch distributed ends``, no ``Load
    weight begin``, no Python error) and a rank was then found dead (``Rank N scheduler is
    dead`` / ``died``, §4, §6): the ranks waited on each other until a watchdog or timeout
    killed them. The wait is the time from the last prefixed line to the death."""
    found = _init_hang(bundle)
    return None if found is None else _init_hang_diagnosis(bundle, found)


def _init_hang_diagnosis(bundle: Bundle, found: InitHang) -> Diagnosis:
    numbers: dict[str, float] = {"nnodes": found.nodes, "tp_size": found.tp}
    if found.waited_s is not None:
        numbers["hang_seconds_until_kill"] = found.waited_s
    if found.code is not None:
        numbers["exit_code"] = int(found.code)
    hits = (found.begin, found.nccl, found.died)
    return Diagnosis(
        category="nccl-init-hang",
        summary=_init_hang_summary(found),
        remedy=_init_hang_remedy(found),
        evidence=[bundle.evidence(hit) for hit in hits if hit is not None],
        numbers=numbers,
    )


def _init_hang_summary(found: InitHang) -> str:
    nodes, tp = found.nodes, found.tp
    what = f"a {nodes}-node launch with TP {tp}" if nodes > 1 else f"TP {tp}"
    done = " after NCCL itself initialised" if found.nccl is not None else ""
    waited = f" for {found.waited_s:g} s" if found.waited_s is not None else ""
    killed = f" (exit code {found.code})" if found.code is not None else ""
    summary = (
        f"distributed init hung on {what}: 'Init torch distributed ends' never came{done}; the "
        f"ranks waited{waited} until rank {found.died[1]['rank']} was killed{killed}"
    )
    if found.fabric is None:
        return summary
    name, addr, default = found.fabric
    unset = "" if found.host_ip_set else " (SGLANG_HOST_IP unset)"
    return summary + (
        f"; --dist-init-addr {addr} is reached on {name}, but the default route is "
        f"{default['name']} ({default['ipv4']}), the address SGLang advertises for its "
        f"cross-node message queue{unset}"
    )


def _init_hang_remedy(found: InitHang) -> str:
    if found.fabric is None:
        return (
            "check that every node reaches --dist-init-addr on one interface: set "
            "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME to it and SGLANG_HOST_IP to each node's "
            "address on it (same subnet as dist-init-addr); NCCL_DEBUG=INFO shows where it stops"
        )
    name, addr, _ = found.fabric
    return (
        "set SGLANG_HOST_IP to each node's fabric IP (set fabric IP per node: "
        f"{addr} on {name} here), and NCCL_SOCKET_IFNAME={name} / GLOO_SOCKET_IFNAME={name} "
        "on every node; the interface must be in the same subnet as dist-init-addr"
    )


# vLLM's shared-memory message queue between the engine and its workers
# (vllm/distributed/device_communicators/shm_broadcast.py) checks /dev/shm before it maps.
SHM_INSUFFICIENT = re.compile(
    r"Insufficient space in /dev/shm: (?P<need>[\d.]+) (?P<unit>[KMG]i?B) required, "
    r"(?P<free>[\d.]+) (?P=unit) free"
)


def shm_insufficient(bundle: Bundle) -> Diagnosis | None:
    """/dev/shm cannot hold the shared-memory queues the ranks exchange work through (vLLM's
    message queue, as NCCL's segments): the container's /dev/shm is too small."""
    hit = bundle.log.first(SHM_INSUFFICIENT)
    if hit is None:
        return None
    unit = hit[1]["unit"]
    need, free, tp = _num(hit[1]["need"]), _num(hit[1]["free"]), bundle.tp()
    key = unit.lower()
    numbers: dict[str, float] = {
        f"required_{key}": need,
        f"free_{key}": free,
        "tensor_parallel_size": tp,
    }
    size = ""
    if shm_bytes := _shm_bytes(bundle):
        numbers["shm_size_mib"] = round(shm_bytes / 2**20)
        size = f" (/dev/shm is {numbers['shm_size_mib']:g} MiB)"
    chunk = next(
        (
            v
            for k, v in (bundle.facts.get("env") or {}).items()
            if k == "VLLM_MQ_MAX_CHUNK_BYTES_MB"
        ),
        None,
    )
    tuned = ""
    if chunk is not None and _num(chunk) == _num(chunk):
        numbers["mq_max_chunk_bytes_mb"] = _num(chunk)
        tuned = f"; VLLM_MQ_MAX_CHUNK_BYTES_MB={chunk} did not bring it under the free space"
    return Diagnosis(
        category="nccl-shm",
        summary=(
            f"/dev/shm too small for the {tp} ranks' shared-memory queues: {hit[1]['need']} "
            f"{unit} required, {hit[1]['free']} {unit} free{size}{tuned}"
        ),
        remedy=(
            "increase /dev/shm: docker run --shm-size 16g (or --ipc=host); in Kubernetes an "
            "emptyDir with medium: Memory and a sizeLimit mounted at /dev/shm"
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


# torch's Gloo (ProcessGroupGloo.cpp): the hostname does not resolve to a local address, so
# the rank binds and advertises the loopback; ranks on other nodes then dial their own lo.
GLOO_LOOPBACK = re.compile(r"Using the loopback address as fallback")
LOOPBACK_REFUSED = re.compile(
    r"(?:Gloo connectFullMesh failed|Connection refused|timed out connecting).*?"
    r"remote=\[127\.0\.0\.1\]:(?P<port>\d+)"
)
RANK_PREFIX = re.compile(r"\[rank(?P<rank>\d+)\]")


def gloo_loopback(bundle: Bundle) -> Diagnosis | None:
    """A multi-node launch whose ranks bound the loopback interface (Gloo's fallback when the
    hostname does not resolve to a routable address): ranks on another node dial 127.0.0.1 and
    never reach each other, so distributed init fails or hangs."""
    fell_back = bundle.log.first(GLOO_LOOPBACK)
    refused = bundle.log.first(LOOPBACK_REFUSED)
    nodes = bundle.facts.get("nodes_in_launch")
    if fell_back is None and refused is None:
        return None
    if refused is None and not (isinstance(nodes, int) and nodes > 1):
        return None  # one node: the loopback reaches every rank
    nodes = nodes if isinstance(nodes, int) and nodes > 1 else 2
    tp = bundle.tp()
    pp = bundle.count("pp_size", default=0) or int(
        bundle.engine_number("pipeline_parallel_size") or 1
    )
    numbers: dict[str, float] = {
        "nodes": nodes,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "world_size": tp * pp,
    }
    failing = ""
    hit = refused or fell_back
    assert hit is not None
    rank = RANK_PREFIX.search(bundle.log.lines[hit[0] - 1])
    if rank is not None:
        numbers["failing_rank"] = int(rank["rank"])
        failing = f"; rank {rank['rank']} dialled 127.0.0.1, its own loopback"
    return Diagnosis(
        category="nccl-init-hang",
        summary=(
            f"distributed init across {nodes} nodes (world size {tp} x {pp} = {tp * pp}, "
            f"TP {tp}, PP {pp}) cannot connect: Gloo fell back to the loopback address, so "
            f"ranks advertise 127.0.0.1 to the other node{failing}"
        ),
        remedy=(
            "set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME on every node to the interface that "
            "routes to the leader (ip route get <leader ip>), or fix hostname resolution so the "
            "hostname maps to that interface's address"
        ),
        evidence=[bundle.evidence(h) for h in (fell_back, refused) if h is not None],
        numbers=numbers,
    )


# NCCL picked peer-to-peer (P2P/IPC) between GPUs joined only by PCIe, then nothing: the first
# collective never completes where PCIe P2P is broken (ACS/IOMMU, consumer boards).
P2P_CHANNEL = re.compile(r"NCCL INFO Channel \S+ : \d+\[\d+\] -> \d+\[\d+\] via P2P/IPC")
INIT_COMPLETE = re.compile(r"NCCL INFO .*Init COMPLETE")
QUIET_SINCE = re.compile(r"(?P<s>\d+) s ago|for (?P<s2>\d+) s")
AFTER_INIT = re.compile(
    r"Loading (?:safetensors|weights)|Load weight begin|Model loading took|Traceback|"
    r"Error|# GPU blocks|KV cache|Application startup complete"
)


def p2p_hang(bundle: Bundle) -> Diagnosis | None:
    """Communicators initialised over P2P/IPC on PCIe-only GPUs and the start-up went no
    further (no weights loaded, no error): the first collective hangs in broken PCIe P2P."""
    channel = bundle.log.first(P2P_CHANNEL)
    if channel is None:
        return None
    complete = bundle.log.find(INIT_COMPLETE)
    if not complete:
        return None
    last = complete[-1][0]
    if any(n > last for n, _ in bundle.log.find(AFTER_INIT)):
        return None
    tp = bundle.tp()
    gpus = bundle.node_gpus() or tp
    numbers: dict[str, float] = {"tensor_parallel_size": tp, "gpu_count": gpus}
    quiet = ""
    note = bundle.note_match(QUIET_SINCE)
    if note is not None:
        numbers["seconds_since_init_complete"] = int(note["s"] or note["s2"])
        quiet = f", and nothing for {numbers['seconds_since_init_complete']} s since"
    return Diagnosis(
        category="nccl-init-hang",
        summary=(
            f"start-up hangs right after NCCL init: the {tp} TP ranks on "
            f"{int(numbers['gpu_count'])} GPUs set up P2P/IPC channels over PCIe, every rank "
            f"printed Init COMPLETE{quiet}; the first collective over P2P over PCIe never "
            "completes"
        ),
        remedy=(
            "disable NCCL peer-to-peer (NCCL_P2P_DISABLE=1, or NCCL_P2P_LEVEL=SYS to keep it "
            "off PCIe), or fix PCIe P2P on the host (disable ACS, check the IOMMU setting)"
        ),
        evidence=[bundle.evidence(channel), bundle.evidence(complete[-1])],
        numbers=numbers,
    )


def startup_collective_timeout(bundle: Bundle) -> Diagnosis | None:
    """NCCL's watchdog ended a collective before the server was ready: a start-up collective
    (after distributed init, often the first one after loading) that some ranks never joined;
    across nodes, usually the other node's ranks (slower or failed load, another model path,
    not started). After ready it is a runtime failure (``runtime.served_then_failed``)."""
    hit = bundle.log.first(NCCL_WATCHDOG)
    if hit is None:
        return None
    ready = bundle.log.first(SERVED)
    if ready is not None and ready[0] < hit[0]:
        return None
    timeout, ran, seq = int(hit[1]["timeout"]), int(hit[1]["ran"]), int(hit[1]["seq"])
    tp = bundle.tp()
    nodes = bundle.facts.get("nodes_in_launch")
    nodes = nodes if isinstance(nodes, int) and nodes > 1 else bundle.count("nnodes")
    numbers: dict[str, float] = {
        "nccl_timeout_ms": timeout,
        "ran_for_ms": ran,
        "seq_num": seq,
        "tp_size": tp,
        "nnodes": nodes,
    }
    loaded = ""
    ends = bundle.log.find(LOAD_END)
    if ends and ends[-1][0] < hit[0]:
        loaded = f"; this node's {len(ends)} ranks had finished loading the weights"
    others = (
        f"; the ranks on the other {nodes - 1} node{'s' if nodes > 2 else ''} never joined"
        if nodes > 1
        else "; a rank never joined"
    )
    return Diagnosis(
        category="nccl-init-hang",
        secondary_categories=[],
        summary=(
            f"a start-up collective timed out before the server was ready (TP {tp} over "
            f"{nodes} node{'s' if nodes > 1 else ''}): {hit[1]['op']} SeqNum={seq} ran for "
            f"{ran} ms against Timeout(ms)={timeout} ({timeout / 1000:g} s){loaded}{others}"
        ),
        remedy=(
            "check the other node's log (a slower or failed weight load, the same model path on "
            "both nodes, that it started at all); load weights from fast local storage on every "
            "node; raise --dist-timeout if its load is merely slow; check NCCL_SOCKET_IFNAME"
        ),
        evidence=[bundle.evidence(hit)],
        numbers=numbers,
    )


#: The line that alone shows each rule's failure, whatever its figures say (engine._unreadable).
RECOGNISES: dict[Rule, tuple[str, re.Pattern[str]]] = {
    nccl_shm: ("nccl-shm", SHM_SEGMENT),
    shm_insufficient: ("nccl-shm", re.compile(r"Insufficient space in /dev/shm")),
}
