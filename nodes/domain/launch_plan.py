"""What a launch needs and whether the node can give it now: ranks, GPUs, ports, environment,
and the pre-flight checks, each with its numbers.

The checks' ``name`` is what an operator passes to ``--override`` to launch despite a failure.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from nodes.domain.budget import BudgetReport
from nodes.domain.sglang_flags import ZMQ_TCP_PORT_DELTA, ParsedCommand
from nodes.domain.units import GiB, format_bytes

#: A GPU counts as idle below this much used memory (the driver itself holds a few MiB).
IDLE_GPU_BYTES = 1 * GiB
#: With more than one rank, NCCL moves data through /dev/shm; Docker's 64 MiB default breaks it.
MIN_SHM_BYTES = 1 * GiB
DEFAULT_PORT = 30000

CHECK_NAMES: tuple[str, ...] = (
    "reservation",
    "quarantine",
    "sglang",
    "budget",
    "gpus_idle",
    "ports_free",
    "model_path",
    "shm",
    "environment",
    "network",
    "dist_init",
)
#: Checks no override can pass: two launches never share GPUs or ports, a quarantined GPU
#: holds memory no process owns until the node is rebooted, and a variable the environment
#: policy refuses would run code the command does not show (an admin allows it per node).
NOT_OVERRIDABLE = frozenset({"reservation", "quarantine", "environment"})


class PlanError(ValueError):
    """The launch cannot be planned as asked (unusable input); the message says why."""


@dataclass
class Check:
    """One pre-flight check: passed or not, with its numbers; ``override`` is the reason an
    operator gave to launch despite its failure."""

    name: str
    passed: bool
    detail: str
    override: str = ""
    # The node it was made on, in a launch over several nodes ("" on one node).
    node: str = ""

    @property
    def blocks(self) -> bool:
        return not self.passed and not self.override

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        if not self.node:
            del doc["node"]
        return doc


def ranks_needed(flags: ParsedCommand) -> int:
    """GPUs one node of this command uses: tp × pp / nnodes (× dp without DP attention, which
    SGLang runs on one node only). Raises ``PlanError`` for sizes SGLang refuses."""
    tp = int(flags.get("tp_size", "tensor_parallel_size", default=1))
    pp = int(flags.get("pp_size", "pipeline_parallel_size", default=1))
    dp = int(flags.get("dp_size", "data_parallel_size", default=1))
    nnodes = int(flags.get("nnodes", default=1))
    if tp < 1 or pp < 1 or dp < 1 or nnodes < 1:
        raise PlanError("tp, pp, dp and nnodes must be at least 1")
    attention_dp = bool(flags.get("enable_dp_attention", default=False))
    if nnodes == 1:
        return tp * pp * (1 if attention_dp else dp)
    if (tp * pp) % nnodes:
        raise PlanError(
            f"tp × pp = {tp * pp} is not divisible by --nnodes {nnodes} (SGLang: "
            '"tp_size must be divisible by number of nodes")'
        )
    if dp != 1 and not attention_dp:
        raise PlanError(
            "SGLang runs --dp-size replicas on one node only: multi-node data parallelism needs "
            '--enable-dp-attention ("multi-node data parallel is not supported unless dp '
            'attention!")'
        )
    return tp * pp // nnodes


def nodes_needed(flags: ParsedCommand) -> int:
    """``--nnodes``: how many nodes the command runs on (1 unless it says)."""
    return int(flags.get("nnodes", default=1))


def server_port(flags: ParsedCommand) -> int:
    return int(flags.get("port", default=DEFAULT_PORT))


def ports_needed(flags: ParsedCommand) -> list[int]:
    """The HTTP port and the ports SGLang derives from it or is told to use (§1b)."""
    port = server_port(flags)
    ports = [port]
    nccl = flags.get("nccl_port")
    if nccl:
        ports.append(int(nccl))
    if flags.get("enable_dp_attention", default=False):
        ports.append(port + ZMQ_TCP_PORT_DELTA)
    return sorted(set(ports))


def parse_gpu_list(text: str) -> list[int]:
    """``"0,1,2"`` → ``[0, 1, 2]``: ASCII digits only, no empty or repeated entries. Raises
    ``PlanError``."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not re.fullmatch(r"[0-9]{1,4}", p) for p in parts):
        raise PlanError(f"{text[:40]!r}: expected GPU indexes separated by commas, e.g. 0,1,2")
    gpus = [int(p) for p in parts]
    repeated = sorted({g for g in gpus if gpus.count(g) > 1})
    if repeated:
        raise PlanError(f"GPU {repeated[0]} is listed twice")
    return gpus


def launch_args(args: Sequence[str], flags: ParsedCommand, port: int) -> list[str]:
    """The revision's flags, with ``--port`` appended when the launch uses another port (the
    last ``--port`` wins, as in argparse)."""
    out = list(args)
    if server_port(flags) != port:
        out += ["--port", str(port)]
    return out


#: The kernel's name of a scheduler rank (its title cut to 15 characters, TASK_COMM_LEN - 1).
RANK_COMM = "sglang::schedul"


def dead_ranks(seen: dict[int, str], members: Iterable[dict[str, object]]) -> list[str]:
    """Scheduler ranks (``sglang::scheduler…`` titles, §4) seen before and now gone or
    defunct, and defunct ranks never seen alive (a rank that died before the follower first
    looked: the kernel keeps its 15-character name, ``sglang::schedul``, after its command line
    is gone). Updates ``seen`` with the ranks alive now. Returns "title (PID n)" of the dead."""
    now: dict[int, tuple[str, str]] = {}
    unseen: list[str] = []
    for member in members:
        command, state = str(member.get("command", "")), str(member.get("state", ""))
        name = str(member.get("name", ""))
        pid = int(str(member["pid"]))
        if command.startswith("sglang::scheduler"):
            now[pid] = (command.split()[0], state)
        elif pid in seen and name.startswith(RANK_COMM):
            # The same rank, its command line not read: the agent reads only the ``stat`` name
            # of a process in uninterruptible sleep (``D``, e.g. pinning host memory), since
            # reading its cmdline can hang. Alive or dead by its state, as any other.
            now[pid] = (seen[pid], state)
        elif state in ("Z", "X") and pid not in seen and name.startswith(RANK_COMM):
            unseen.append(f"sglang::scheduler (PID {pid}, defunct)")
    dead = [
        f"{title} (PID {pid})"
        for pid, title in seen.items()
        if pid not in now or now[pid][1] in ("Z", "X")
    ]
    seen.update({pid: title for pid, (title, state) in now.items() if state not in ("Z", "X")})
    return dead + unseen


def check_port_numbers(ports: Iterable[int]) -> None:
    """Raises ``PlanError`` for a port no TCP server can listen on."""
    bad = [p for p in ports if not 1 <= p <= 65535]
    if bad:
        raise PlanError(f"port {bad[0]} is not a TCP port (1–65535)")


def choose_gpus(
    indexes: Iterable[int], unavailable: Iterable[int], count: int, wanted: Sequence[int] | None
) -> list[int]:
    """The GPUs to use: ``wanted`` as given (checked), else the first ``count`` available.

    Raises ``PlanError`` when the node lacks them.
    """
    present = sorted(indexes)
    if wanted:
        chosen = list(dict.fromkeys(wanted))
        missing = [g for g in chosen if g not in present]
        if missing:
            raise PlanError(f"the node has no GPU {', '.join(map(str, missing))}")
        if len(chosen) != count:
            raise PlanError(
                f"the command runs {count} rank(s) on this node, so it needs {count} GPU(s); "
                f"{len(chosen)} chosen"
            )
        return chosen
    busy = set(unavailable)
    free = [g for g in present if g not in busy]
    if len(free) < count:
        raise PlanError(
            f"the command needs {count} GPU(s); the node has {len(free)} free of {len(present)}"
        )
    return free[:count]


def launch_env(env: dict[str, str], gpus: Sequence[int]) -> dict[str, str]:
    """The server's environment: the profile's, with CUDA_VISIBLE_DEVICES set to the GPUs
    reserved (SGLang numbers its ranks' devices from 0 inside that list)."""
    return {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}


def check_environment(refusals: Sequence[str]) -> Check:
    """The environment policy's word on the launch's variables (``env_policy.refusals``)."""
    if refusals:
        return Check("environment", False, "; ".join(refusals))
    return Check("environment", True, "no variable the environment policy refuses")


def check_budget(report: BudgetReport) -> Check:
    """The memory verdict; flags the version refuses are the ``sglang`` check's to report."""
    blocks = [
        m.text for m in report.messages if m.level == "block" and not m.code.startswith("flag_")
    ]
    warns = [m.text for m in report.messages if m.level == "warn"]
    if blocks:
        fix = ""
        if report.suggestion:
            fix = " — suggested: " + " ".join(f"{k} {v}" for k, v in report.suggestion.items())
        return Check("budget", False, "; ".join(blocks) + fix)
    parts = []
    if report.host_pool_bytes_per_node:
        parts.append(
            f"host pool {format_bytes(report.host_pool_bytes_per_node, 'GB')} per node"
            + (
                f" within {format_bytes(report.host_budget_bytes, 'GB')} available"
                if report.host_budget_bytes
                else ""
            )
        )
    if report.device_kv_tokens_per_rank:
        parts.append(f"device KV pool {report.device_kv_tokens_per_rank:,} tokens per rank")
    detail = "; ".join(parts) or "fits"
    if warns:
        detail += " — warning: " + "; ".join(warns)
    return Check("budget", True, detail)


@dataclass(frozen=True)
class GpuNow:
    """A GPU as a probe just read it: memory used in bytes and its processes (pid, name)."""

    index: int
    memory_used_bytes: int
    processes: tuple[tuple[int, str], ...] = ()


def check_quarantine(quarantined: Mapping[int, str], chosen: Sequence[int]) -> Check:
    """Refuses GPUs the panel quarantined after a cleanup could not free them."""
    problems = [f"GPU {i} is quarantined: {quarantined[i]}" for i in chosen if i in quarantined]
    if problems:
        return Check("quarantine", False, "; ".join(problems))
    return Check("quarantine", True, "no chosen GPU is quarantined")


def check_gpus_idle(
    gpus: Sequence[GpuNow], chosen: Sequence[int], quarantined: Collection[int] = ()
) -> Check:
    """Refuses chosen GPUs a process uses or memory holds; memory with no process on a GPU a
    cleanup already ``quarantined`` is said as that (a reboot frees it, not another cleanup)."""
    by_index = {g.index: g for g in gpus}
    problems = []
    for index in chosen:
        gpu = by_index.get(index)
        if gpu is None:
            problems.append(f"GPU {index} was not found by the probe")
            continue
        if gpu.processes:
            pids = ", ".join(f"PID {pid} ({name})" for pid, name in gpu.processes)
            problems.append(
                f"GPU {index} is used by {pids}: {format_bytes(gpu.memory_used_bytes, 'GiB')} held"
            )
        elif gpu.memory_used_bytes > IDLE_GPU_BYTES:
            why = (
                "quarantined: a cleanup could not free it; a driver reload or a reboot does"
                if index in quarantined
                else "held memory; clean up first"
            )
            problems.append(
                f"GPU {index} has {format_bytes(gpu.memory_used_bytes, 'GiB')} used with no "
                f"process ({why})"
            )
    if problems:
        return Check("gpus_idle", False, "; ".join(problems))
    return Check("gpus_idle", True, f"GPU {', '.join(map(str, chosen))} idle")


def check_ports(needed: Sequence[int], listening: Iterable[int]) -> Check:
    taken = sorted(set(needed) & set(listening))
    if taken:
        return Check(
            "ports_free",
            False,
            f"port {', '.join(map(str, taken))} already has a listener on the node",
        )
    return Check("ports_free", True, f"port {', '.join(map(str, needed))} free")


def check_model(model_path: str, found: bool | None, detail: str) -> Check:
    if found is None:
        return Check("model_path", True, f"{model_path}: {detail}")
    if not found:
        return Check("model_path", False, f"{model_path}: {detail}")
    return Check("model_path", True, f"{model_path}/config.json present")


#: SGLang flags under which code that is not SGLang's runs in the server (server_args.py):
#: ``--trust-remote-code`` imports the model folder's own Python (transformers'
#: ``trust_remote_code``: modeling/tokenizer files shipped with the checkpoint), and
#: ``--enable-custom-logit-processor`` unpickles a processor each request may send (dill).
CODE_FLAGS = {
    "--trust-remote-code": "runs the Python files shipped in the model folder",
    "--enable-custom-logit-processor": "runs code that any request may send with it",
}


def code_on_node(args: Sequence[str], user: str, node: str = "") -> str | None:
    """What ``args`` let run in the server besides SGLang, and as whom: one sentence, or None
    when neither ``CODE_FLAGS`` flag is given (a warning to read, not a refusal)."""
    given = [f for f in CODE_FLAGS if any(a == f or a.startswith(f + "=") for a in args)]
    if not given:
        return None
    where = f" on {node}" if node else ""
    said = "; ".join(f"{f} {CODE_FLAGS[f]}" for f in given)
    rights = " (root: every right on the node)" if user == "root" else ""
    return f"{said}: it runs{where} as {user}{rights}"


def check_code_on_node(args: Sequence[str], user: str) -> Check | None:
    """A passing check that says what code besides SGLang runs, as whom (``code_on_node``)."""
    said = code_on_node(args, user)
    return None if said is None else Check("code_on_node", True, f"warning: {said}")


def check_shm(shm_bytes: int | None, ranks: int) -> Check:
    if shm_bytes is None:
        return Check("shm", ranks == 1, "/dev/shm size unknown")
    size = format_bytes(shm_bytes, "GiB")
    if ranks > 1 and shm_bytes < MIN_SHM_BYTES:
        return Check(
            "shm",
            False,
            f"/dev/shm is {size}; {ranks} ranks need at least {format_bytes(MIN_SHM_BYTES, 'GiB')}"
            " for NCCL",
        )
    return Check("shm", True, f"/dev/shm {size}")


def check_sglang(version: str | None, problem: str | None, flags: ParsedCommand) -> Check:
    if not version:
        return Check("sglang", False, problem or "SGLang was not found by the node's interpreter")
    issues = [i.message for i in flags.issues]
    if issues:
        return Check("sglang", False, f"SGLang {version} refuses: " + "; ".join(issues))
    return Check("sglang", True, f"SGLang {version} accepts every flag")


def apply_overrides(checks: list[Check], overrides: dict[str, str]) -> list[Check]:
    """Mark failed checks named in ``overrides`` (name → reason) as overridden."""
    for check in checks:
        reason = overrides.get(check.name, "")
        if reason and not check.passed and check.name not in NOT_OVERRIDABLE:
            check.override = reason
    return checks


def unknown_overrides(overrides: Iterable[str]) -> list[str]:
    return [name for name in overrides if name not in CHECK_NAMES or name in NOT_OVERRIDABLE]
