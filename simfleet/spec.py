"""What each simulated node looks like: GPUs, RAM, SGLang version, faults."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from simfleet.sizes import parse_size

FAULTS = ("leak-on-crash", "no-nvml", "no-pynvml", "no-driver", "stuck-on-kill")
SGLANG_VERSIONS = ("0.4.10.post2", "0.5.2", "0.5.9", "0.5.23")


@dataclass
class NodeSpec:
    """One node's hardware and behaviour. Sizes are bytes."""

    name: str
    gpus: int = 8
    gpu_name: str = "NVIDIA H200"
    gpu_memory_bytes: int = parse_size("141GiB")
    host_ram_bytes: int = parse_size("449GB")
    sglang_version: str = "0.5.9"
    faults: list[str] = field(default_factory=list)
    cgroup_limit_bytes: int | None = None
    shm_bytes: int = parse_size("64GiB")
    speed: float = 1.0
    driver_version: str = "570.133.20"
    cuda_version: str = "12.8"

    def validate(self) -> None:
        unknown = [f for f in self.faults if f not in FAULTS]
        if unknown:
            raise ValueError(f"unknown fault {unknown[0]!r}; known: {', '.join(FAULTS)}")
        if self.sglang_version not in SGLANG_VERSIONS:
            raise ValueError(
                f"SGLang {self.sglang_version} is not simulated; use {', '.join(SGLANG_VERSIONS)}"
            )
        if not 0 <= self.gpus <= 16:
            raise ValueError("a simulated node has 0 to 16 GPUs")

    def node_json(self, boot_time: float) -> dict[str, Any]:
        """The settings the node's own programs read (``/run/simfleet/node.json``)."""
        seed = hashlib.sha1(self.name.encode()).hexdigest()
        gpus = [
            {
                "index": i,
                "uuid": f"GPU-{seed[:8]}-{seed[8:12]}-{i:04x}-{seed[12:16]}-{seed[16:28]}",
                "name": self.gpu_name,
                "memory_total_bytes": self.gpu_memory_bytes,
                "pci_bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            }
            for i in range(self.gpus)
        ]
        return {
            **asdict(self),
            "gpus": gpus,
            "base_used_bytes": max(2 * 2**30, self.host_ram_bytes // 100),
            "boot_time": boot_time,
        }


def from_options(name: str, options: dict[str, Any]) -> NodeSpec:
    """Build a spec from CLI options or one entry of a ``--spec`` file (sizes with units)."""
    spec = NodeSpec(name=name)
    for key, value in options.items():
        if value is None:
            continue
        if key in ("gpu_memory", "host_ram", "shm", "cgroup_limit"):
            setattr(spec, f"{key}_bytes", parse_size(value))
        elif key == "fault":
            spec.faults = list(value)
        elif hasattr(spec, key):
            setattr(spec, key, value)
        else:
            raise ValueError(f"unknown node setting {key!r}")
    spec.validate()
    return spec


def load_spec_file(path: str) -> list[dict[str, Any]]:
    """A spec file: ``{"nodes": [{"gpus": 4, "host_ram": "200GB", "faults": [...]}, ...]}``."""
    with open(path) as handle:
        data = json.load(handle)
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
        raise ValueError(f'{path}: expected {{"nodes": [{{...}}, ...]}}')
    return nodes
