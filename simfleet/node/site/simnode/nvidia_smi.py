"""``nvidia-smi`` for a simulated node: the queries Rankwise uses, in the real output formats.

Supported: ``-L``; ``--query-gpu=FIELDS`` and ``--query-compute-apps=FIELDS`` with
``--format=csv[,noheader][,nounits]``; ``-i N``; ``--gpu-reset -i N``; and the default table.
Memory is in MiB as the real tool prints it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from simnode import gpus as gpu_state
from simnode import state

MiB = 2**20

_GPU_FIELDS = {
    "index": ("index", lambda g, c: str(g.index)),
    "uuid": ("uuid", lambda g, c: g.uuid),
    "gpu_uuid": ("uuid", lambda g, c: g.uuid),
    "name": ("name", lambda g, c: g.name),
    "gpu_name": ("name", lambda g, c: g.name),
    "pci.bus_id": ("pci.bus_id", lambda g, c: g.pci_bus_id),
    "memory.total": ("memory.total [MiB]", lambda g, c: _mib(g.total_bytes)),
    "memory.used": ("memory.used [MiB]", lambda g, c: _mib(g.used_bytes)),
    "memory.free": ("memory.free [MiB]", lambda g, c: _mib(g.free_bytes)),
    "driver_version": ("driver_version", lambda g, c: c["driver_version"]),
    "cuda_version": ("cuda_version", lambda g, c: c["cuda_version"]),
    "utilization.gpu": ("utilization.gpu [%]", lambda g, c: "0" if not g.processes else "37"),
    "temperature.gpu": ("temperature.gpu", lambda g, c: "34"),
    "count": ("count", lambda g, c: str(len(c["gpus"]))),
    "persistence_mode": ("persistence_mode", lambda g, c: "Enabled"),
}
_APP_FIELDS = {
    "gpu_uuid": ("gpu_uuid", lambda g, p: g.uuid),
    "gpu_name": ("gpu_name", lambda g, p: g.name),
    "gpu_bus_id": ("gpu_bus_id", lambda g, p: g.pci_bus_id),
    "pid": ("pid", lambda g, p: str(p.pid)),
    "process_name": ("process_name", lambda g, p: p.name),
    "name": ("process_name", lambda g, p: p.name),
    "used_memory": ("used_gpu_memory [MiB]", lambda g, p: _mib(p.used_bytes)),
    "used_gpu_memory": ("used_gpu_memory [MiB]", lambda g, p: _mib(p.used_bytes)),
}


def _mib(size: int) -> str:
    return str(size // MiB)


def _fail(message: str, code: int) -> int:
    sys.stdout.write(message + "\n")
    return code


def main(argv: list[str]) -> int:
    if state.has_fault("no-driver"):
        # The real binary is simply absent then; this copy is never installed on such a node.
        return _fail("nvidia-smi: command not found", 127)
    options = _parse(argv)
    if isinstance(options, str):
        return _fail(options, 2)
    gpus = gpu_state.view()
    if options.get("index") is not None:
        wanted = options["index"]
        if not all(0 <= i < len(gpus) for i in wanted):
            return _fail(
                f"No devices were found matching the index {','.join(map(str, wanted))}", 6
            )
        gpus = [g for g in gpus if g.index in wanted]
    if "reset" in options:
        return _reset(gpus)
    if options.get("list"):
        for g in gpus:
            sys.stdout.write(f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n")
        return 0
    if "query_gpu" in options:
        return _query(options, gpus, _GPU_FIELDS, [(g, state.config()) for g in gpus])
    if "query_apps" in options:
        rows = [(g, p) for g in gpus for p in g.processes]
        return _query(options, gpus, _APP_FIELDS, rows, key="query_apps")
    _table(gpus)
    return 0


def _parse(argv: list[str]) -> dict[str, Any] | str:
    options: dict[str, Any] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-L", "--list-gpus"):
            options["list"] = True
        elif arg.startswith("--query-gpu="):
            options["query_gpu"] = arg.split("=", 1)[1]
        elif arg.startswith("--query-compute-apps="):
            options["query_apps"] = arg.split("=", 1)[1]
        elif arg.startswith("--format="):
            options["format"] = arg.split("=", 1)[1].split(",")
        elif arg in ("-i", "--id") or arg.startswith("--id="):
            value = arg.split("=", 1)[1] if "=" in arg else (args.pop(0) if args else "")
            try:
                options["index"] = [int(v) for v in value.split(",")]
            except ValueError:
                return f'Invalid value "{value}" for "-i"'
        elif arg in ("-r", "--gpu-reset"):
            options["reset"] = True
        elif arg in ("-q", "--query", "-x"):
            options.setdefault("table", True)
        else:
            return (
                "Invalid combination of input arguments. "
                f"Please run 'nvidia-smi -h' for help.\n{arg}"
            )
    if ("query_gpu" in options or "query_apps" in options) and "format" not in options:
        return "Error: --format must be specified with --query-*."
    return options


def _query(options, gpus, table, rows, key="query_gpu") -> int:  # type: ignore[no-untyped-def]
    fields = [f.strip() for f in str(options[key]).split(",") if f.strip()]
    unknown = [f for f in fields if f not in table]
    if unknown:
        return _fail(f'Field "{unknown[0]}" is not a valid field to query.', 2)
    fmt = options["format"]
    out = sys.stdout
    if "noheader" not in fmt:
        out.write(", ".join(table[f][0] for f in fields) + "\n")
    for subject, extra in rows:
        values = []
        for f in fields:
            value = table[f][1](subject, extra)
            if "nounits" not in fmt and "[MiB]" in table[f][0]:
                value += " MiB"
            values.append(value)
        out.write(", ".join(values) + "\n")
    return 0


def _reset(gpus) -> int:  # type: ignore[no-untyped-def]
    status = 0
    for g in gpus:
        error = gpu_state.reset(g.index)
        if error:
            sys.stdout.write(error + "\n")
            status = 3
        else:
            sys.stdout.write(f"GPU {g.pci_bus_id} was successfully reset.\n")
    return status


def _table(gpus) -> None:  # type: ignore[no-untyped-def]
    conf = state.config()
    out = sys.stdout
    out.write(time.strftime("%a %b %d %H:%M:%S %Y") + "\n")
    out.write("+" + "-" * 87 + "+\n")
    out.write(
        f"| NVIDIA-SMI {conf['driver_version']:<18} Driver Version: {conf['driver_version']:<15}"
        f"CUDA Version: {conf['cuda_version']:<9}|\n"
    )
    out.write("|" + "-" * 87 + "|\n")
    for g in gpus:
        used, total = _mib(g.used_bytes), _mib(g.total_bytes)
        out.write(
            f"| {g.index:>3}  {g.name:<28} On | {g.pci_bus_id:<16} Off | "
            f"{used + 'MiB / ' + total + 'MiB':>22}     |\n"
        )
    out.write("+" + "-" * 87 + "+\n")
    out.write("| Processes:" + " " * 77 + "|\n")
    out.write("|  GPU   PID   Type   Process name" + " " * 34 + "GPU Memory |\n")
    rows = [(g, p) for g in gpus for p in g.processes]
    if not rows:
        out.write("|  No running processes found" + " " * 59 + "|\n")
    for g, p in rows:
        out.write(
            f"| {g.index:>4} {p.pid:>7}      C   {p.name[:40]:<40} {_mib(p.used_bytes):>9}MiB |\n"
        )
    out.write("+" + "-" * 87 + "+\n")
