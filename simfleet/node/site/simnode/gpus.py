"""GPU memory as NVML and nvidia-smi report it, computed from the node's ledger."""

from __future__ import annotations

from dataclasses import dataclass, field

from simnode import state

MiB = 2**20
# What an idle GPU reports as used (driver reservations), as on real H100/H200 boards.
IDLE_USED_BYTES = 4 * MiB


@dataclass
class GpuProcess:
    pid: int
    name: str
    used_bytes: int


@dataclass
class GpuView:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    total_bytes: int
    used_bytes: int = IDLE_USED_BYTES
    processes: list[GpuProcess] = field(default_factory=list)

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - self.used_bytes)


def view() -> list[GpuView]:
    """Every GPU with its used memory and the processes using it (leaked memory has none)."""
    gpus = [
        GpuView(g["index"], g["uuid"], g["name"], g["pci_bus_id"], g["memory_total_bytes"])
        for g in state.config()["gpus"]
    ]
    by_index = {g.index: g for g in gpus}
    for entry in state.entries():
        for index, size in entry.get("gpu", {}).items():
            gpu = by_index.get(int(index))
            if gpu is not None and size:
                gpu.used_bytes += size
                gpu.processes.append(GpuProcess(entry["pid"], entry.get("name", ""), size))
    for entry in state.leaked():
        for index, size in entry.get("gpu", {}).items():
            gpu = by_index.get(int(index))
            if gpu is not None:
                gpu.used_bytes += size
    for gpu in gpus:
        gpu.used_bytes = min(gpu.used_bytes, gpu.total_bytes)
    return gpus


def reset(index: int) -> str | None:
    """Clear leaked memory on one GPU; return an error text as nvidia-smi words it, or None."""
    gpus = view()
    if not 0 <= index < len(gpus):
        return f"No GPU with index {index}"
    if state.has_fault("leak-on-crash"):
        # The node is a container: resets need the host, as on real containerised nodes.
        return f"GPU {gpus[index].pci_bus_id}: Resetting GPU is not supported in this environment."
    if gpus[index].processes:
        return (
            f"GPU {gpus[index].pci_bus_id} is currently in use by another process.\n\n"
            "1 device is currently being used by one or more other processes (e.g., Fabric "
            "Manager, CUDA application, graphics application such as an X server, or a "
            "monitoring application such as another instance of nvidia-smi). Please first kill "
            "all processes using this device and all compute applications running in the system."
        )
    import json
    import os

    with state.locked():
        folder = state.path("leaked")
        for name in os.listdir(folder):
            target = os.path.join(folder, name)
            with open(target) as handle:
                entry = json.load(handle)
            entry.get("gpu", {}).pop(str(index), None)
            with open(target, "w") as handle:
                json.dump(entry, handle)
        state.publish()
    return None
