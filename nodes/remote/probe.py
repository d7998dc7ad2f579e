"""The inventory probe: run on a node as ``python3 - [--live] [SGLANG_PYTHON]`` with this file on
stdin. Prints one JSON document and exits 0; every failure becomes a reason in the document.

GPU facts come from NVML (the ``pynvml`` module of nvidia-ml-py) and, when NVML is unusable,
from ``nvidia-smi --query-gpu`` CSV; the output says which (``gpu_source``). With ``--live``
only what the heartbeat needs is collected: GPU memory in use and host memory available.
Stdlib only: it runs on whatever ``python3`` (3.7 or newer) the node has.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any

SMI_GPU_FIELDS = "index,uuid,name,memory.total,memory.used,driver_version,pci.bus_id"
SMI_APP_FIELDS = "gpu_uuid,pid,process_name,used_memory"


def nvml() -> dict[str, object]:
    """GPUs and their processes through NVML, or raise with NVML's own words."""
    import pynvml  # type: ignore[import-not-found,unused-ignore]

    pynvml.nvmlInit()
    try:
        gpus: list[dict[str, object]] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            processes = [
                {"pid": p.pid, "used_memory_bytes": p.usedGpuMemory or 0}
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            ]
            gpus.append(
                {
                    "index": index,
                    "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_total_bytes": memory.total,
                    "memory_used_bytes": memory.used,
                    "processes": processes,
                }
            )
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        return {
            "gpus": gpus,
            "driver_version": driver.decode() if isinstance(driver, bytes) else driver,
            "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
        }
    finally:
        pynvml.nvmlShutdown()


def smi() -> dict[str, str]:
    """The raw CSV of nvidia-smi; the panel parses it."""
    gpus = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_GPU_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    if gpus.returncode != 0:
        raise RuntimeError((gpus.stdout + gpus.stderr).strip() or f"exit {gpus.returncode}")
    apps = subprocess.run(
        ["nvidia-smi", f"--query-compute-apps={SMI_APP_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    return {"gpu_csv": gpus.stdout, "apps_csv": apps.stdout if apps.returncode == 0 else ""}


def process_names(pids: list[int]) -> dict[str, str]:
    names: dict[str, str] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                names[str(pid)] = handle.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            names[str(pid)] = ""
    return names


def meminfo() -> dict[str, int]:
    values: dict[str, int] = {}
    with open("/proc/meminfo") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                values[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return values


def cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as handle:
                text = handle.read().strip()
        except OSError:
            continue
        return None if text == "max" or int(text) >= 2**62 else int(text)
    return None


def shm_bytes() -> int | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def sglang(python: str) -> tuple[str | None, str | None]:
    try:
        result = subprocess.run(
            [python, "-c", "import sglang, sys; sys.stdout.write(sglang.__version__)"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"{python}: no answer within 20 s (import sglang hangs?)"
    except OSError as exc:
        return None, f"{python}: {exc}"
    if result.returncode != 0:
        last = result.stderr.strip().splitlines() or ["exit status " + str(result.returncode)]
        return None, f"{python}: {last[-1]}"
    return result.stdout.strip(), None


def os_release() -> str:
    try:
        with open("/etc/os-release") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


def main(argv: list[str]) -> None:
    live = "--live" in argv
    args = [a for a in argv if a != "--live"]
    errors: dict[str, str | None] = {}
    doc: dict[str, Any] = {"probe": 1, "errors": errors}
    try:
        doc["nvml"] = nvml()
    except Exception as exc:  # NVML missing or failing: say why, then try nvidia-smi
        doc["errors"]["nvml"] = f"{type(exc).__name__}: {exc}"
        try:
            doc["nvidia_smi"] = smi()
        except Exception as exc2:
            doc["errors"]["nvidia_smi"] = f"{type(exc2).__name__}: {exc2}"
    pids: list[int] = []
    for gpu in doc.get("nvml", {}).get("gpus", []):
        pids += [p["pid"] for p in gpu["processes"]]
    for line in doc.get("nvidia_smi", {}).get("apps_csv", "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > 1 and cells[1].isdigit():
            pids.append(int(cells[1]))
    doc["process_names"] = process_names(pids)
    doc["meminfo"] = meminfo()
    if not live:
        doc["cgroup_limit_bytes"] = cgroup_limit()
        doc["shm_bytes"] = shm_bytes()
        doc["cpu_count"] = os.cpu_count()
        doc["os"] = os_release()
        doc["kernel"] = platform.release()
        doc["sglang_version"], doc["errors"]["sglang"] = sglang(args[0] if args else "python3")
    sys.stdout.write(json.dumps(doc))


main(sys.argv[1:])
