"""Rules for what a node in the inventory may look like, and how it is summarised.

Each ``check_*`` function returns ``None`` when the value is acceptable, else a message fit to show
next to the field. Forms and the CLI both call these, so the same input gets the same answer.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from nodes.domain.units import GB, GiB, TiB, format_bytes

#: Largest GPU count per node that Rankwise accepts (HGX boards carry 8; some chassis 16).
MAX_GPUS_PER_NODE = 64
#: Per-GPU memory bounds. The largest parts shipping in 2026 carry 288 GB; 4 TiB is "absurd".
MIN_GPU_MEMORY_BYTES = 1 * GiB
MAX_GPU_MEMORY_BYTES = 4 * TiB
#: Host RAM bounds: under 1 GB cannot host an inference server; over 64 TiB is a typo.
MIN_HOST_RAM_BYTES = 1 * GB
MAX_HOST_RAM_BYTES = 64 * TiB

_NODE_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?$")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
# POSIX portable user names, as useradd accepts them by default.
_SSH_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/=-]{0,62}$")


@dataclass(frozen=True)
class GpuSpec:
    """One GPU as the inventory records it: index on the node, model name, total memory in bytes."""

    index: int
    name: str
    memory_total_bytes: int


def check_node_name(name: str) -> str | None:
    """Node names are lower-case DNS-like labels: a-z, 0-9, '.', '_', '-', at most 63 characters."""
    if not _NODE_NAME.fullmatch(name):
        return (
            "Use 1–63 lower-case letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit."
        )
    return None


def check_host(host: str) -> str | None:
    """A host is an IPv4/IPv6 address or an RFC 1123 host name (no spaces, no leading '-')."""
    if not host:
        return "Enter a host name or IP address."
    if "%" in host:
        # ipaddress accepts any IPv6 zone id ("fe80::1%anything"); SSH targets need none.
        return f"{host!r} is not a valid host name or IP address (no zone ids)."
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return None
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_HOST_LABEL.match(label) for label in name.split(".")):
        return f"{host!r} is not a valid host name or IP address."
    if name.split(".")[-1].isdigit():
        return f"{host!r} is not a valid IP address."
    return None


def check_ssh_user(user: str) -> str | None:
    """SSH user names follow POSIX: a lower-case letter or '_', then letters, digits, '_', '-'."""
    if not _SSH_USER.match(user):
        return f"{user!r} is not a valid user name (lower-case letters, digits, '_' and '-')."
    return None


def check_run_as_user(user: str) -> str | None:
    """The unprivileged account servers run as: a valid user name, and not ``root`` (uid 0),
    which is what a blank choice already gives when the SSH user is root."""
    if problem := check_ssh_user(user):
        return problem
    if user == "root":
        return (
            "root is not an unprivileged user: name an account without root's rights (servers "
            "then cannot touch the rest of the node), or leave this blank to run as the SSH user."
        )
    return None


def check_port(port: int) -> str | None:
    """TCP ports run from 1 to 65535."""
    if not 1 <= port <= 65535:
        return "A port is a number from 1 to 65535."
    return None


def check_gpu_count(count: int) -> str | None:
    """Between 0 (not known yet) and ``MAX_GPUS_PER_NODE`` GPUs."""
    if not 0 <= count <= MAX_GPUS_PER_NODE:
        return f"A node has between 0 and {MAX_GPUS_PER_NODE} GPUs."
    return None


def check_gpu_memory(size: int) -> str | None:
    """Per-GPU memory between 1 GiB and 4 TiB, in bytes."""
    if not MIN_GPU_MEMORY_BYTES <= size <= MAX_GPU_MEMORY_BYTES:
        low, high = format_bytes(MIN_GPU_MEMORY_BYTES), format_bytes(MAX_GPU_MEMORY_BYTES, "TiB")
        return (
            f"{format_bytes(size, places=3)} ({size:,} bytes) per GPU is outside the plausible "
            f"range ({low} to {high})."
        )

    return None


def check_host_ram(size: int) -> str | None:
    """Host RAM between 1 GB and 64 TiB, in bytes."""
    if not MIN_HOST_RAM_BYTES <= size <= MAX_HOST_RAM_BYTES:
        return (
            f"{format_bytes(size, 'GB', places=3)} ({size:,} bytes) of host RAM is outside the "
            "plausible range "
            f"({format_bytes(MIN_HOST_RAM_BYTES, 'GB')} to "
            f"{format_bytes(MAX_HOST_RAM_BYTES, 'TiB')})."
        )
    return None


def parse_labels(text: str) -> tuple[list[str], str | None]:
    """Split comma-separated labels; return ``(labels, error message or None)``.

    Labels are short tokens such as ``rack=a3`` or ``h200``; duplicates are dropped, order kept.
    """
    labels: list[str] = []
    for raw in text.split(","):
        label = raw.strip()
        if not label:
            continue
        if not _LABEL.match(label):
            return [], f"{label!r} is not a label: use letters, digits and . _ : / = - (max 63)."
        if label not in labels:
            labels.append(label)
    return labels, None


def uniform_gpus(count: int, name: str, memory_total_bytes: int) -> list[GpuSpec]:
    """``count`` identical GPUs with indexes 0..count-1."""
    return [GpuSpec(index, name, memory_total_bytes) for index in range(count)]


def gpu_summary(gpus: Iterable[GpuSpec]) -> str:
    """One line for a node's GPUs: ``"8 × NVIDIA H200 · 141 GiB"``, groups joined with ``" + "``.

    Memory is per GPU, in GiB. An empty list reads ``"no GPUs recorded"``.
    """
    groups = Counter((gpu.name, gpu.memory_total_bytes) for gpu in gpus)
    if not groups:
        return "no GPUs recorded"
    return " + ".join(
        f"{count} × {name} · {format_bytes(memory)}" for (name, memory), count in groups.items()
    )


def node_status(
    *, reachable: bool, maintenance: bool, problems: Iterable[str], error: str | None = None
) -> tuple[str, str]:
    """``(status, reason)`` for a node: ``maintenance`` wins, then ``unreachable`` (with the
    error), then ``degraded`` (with the problems, e.g. GPUs not detected), else ``ready``."""
    found = [p for p in problems if p]
    if maintenance:
        return "maintenance", "; ".join(found)
    if not reachable:
        return "unreachable", error or "no answer"
    if found:
        return "degraded", "; ".join(found)
    return "ready", ""


def check_python_path(path: str) -> str | None:
    """The SGLang interpreter: a bare command (``python3``) or an absolute path, no whitespace."""
    if not path or len(path) > 1024 or not path.isprintable() or any(c.isspace() for c in path):
        return "Give an interpreter such as python3 or /opt/sglang/.venv/bin/python (no spaces)."
    if "/" in path and not path.startswith("/"):
        return "Give an absolute path, or a bare command name found on the node's PATH."
    if path.startswith("-"):
        return "An interpreter path cannot start with '-'."
    return None
