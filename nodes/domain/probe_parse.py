"""Read what the inventory probe (``nodes/remote/probe.py``) printed on a node.

Shapes follow the sources: NVML memory in bytes (``nvmlDeviceGetMemoryInfo``: total/used,
nvidia-ml-py); ``nvidia-smi --format=csv,noheader,nounits`` memory in MiB (NVIDIA's nvidia-smi
documentation, "memory.total": "Total installed GPU memory", reported in MiB); ``/proc/meminfo``
in kB (1024 bytes, proc(5)). Everything here returns integer bytes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

MiB = 2**20


class ProbeError(ValueError):
    """The probe's output is not what it prints: the node ran something else, or it broke."""


@dataclass(frozen=True)
class GpuProcess:
    """A process using a GPU: node-side PID, name (argv[0]), GPU memory in bytes; the Rankwise
    launch it belongs to (its ``RANKWISE_LAUNCH_ID``) and the user it runs as, where read."""

    pid: int
    name: str
    used_memory_bytes: int
    launch_id: int | None = None
    user: str | None = None


@dataclass(frozen=True)
class GpuFacts:
    """One GPU: index on the node, UUID, model name, memory total/used in bytes, its processes."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class NodeFacts:
    """Everything one probe learned. Sizes are bytes; ``None`` means not known."""

    gpus: tuple[GpuFacts, ...] = ()
    gpu_source: str | None = None  # "nvml" or "nvidia-smi"
    # Which answered and why, in words: NVML through which pynvml, or nvidia-smi and NVML's
    # error (``gpu_reading_words``).
    gpu_reading: str | None = None
    # The pynvml module the agent used: "node" (the node's own), "panel" (nvidia-ml-py sent by
    # the panel, nodes/remote/shipped.py) or None (none could be imported); its version.
    pynvml_from: str | None = None
    pynvml_version: str | None = None
    nvml_error: str | None = None  # NVML's own words when it did not answer
    driver_version: str | None = None
    cuda_version: str | None = None
    host_ram_bytes: int | None = None
    mem_available_bytes: int | None = None
    hugepages_bytes: int | None = None
    cgroup_limit_bytes: int | None = None
    cpu_count: int | None = None
    shm_bytes: int | None = None
    os: str | None = None
    kernel: str | None = None
    sglang_version: str | None = None
    problems: tuple[str, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Launch ids with a process left on the node (their host memory may still be pinned);
    # None when the probe did not say.
    live_launches: tuple[int, ...] | None = None
    # The node's addresses, ``(interface, "address/prefix")`` (``ip -j addr``, link-local left
    # out): where a multi-node launch's nodes meet.
    interfaces: tuple[tuple[str, str], ...] = ()
    # The node's user names (for the user servers run as); None when not listed.
    accounts: tuple[str, ...] | None = None

    @property
    def gpus_detected(self) -> bool:
        return self.gpu_source is not None and bool(self.gpus)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: lists for tuples, integer bytes."""
        doc = asdict(self)
        doc["gpus"] = [asdict(g) for g in self.gpus]
        doc["problems"] = list(self.problems)
        doc["notes"] = list(self.notes)
        doc["live_launches"] = list(self.live_launches) if self.live_launches is not None else None
        doc["interfaces"] = [list(i) for i in self.interfaces]
        doc["accounts"] = list(self.accounts) if self.accounts is not None else None
        return doc


def facts_from_json(doc: dict[str, Any]) -> NodeFacts:
    """The inverse of ``NodeFacts.to_json``; raises KeyError/TypeError on another shape."""
    gpus = tuple(
        GpuFacts(
            index=g["index"],
            uuid=g["uuid"],
            name=g["name"],
            memory_total_bytes=g["memory_total_bytes"],
            memory_used_bytes=g["memory_used_bytes"],
            processes=tuple(GpuProcess(**p) for p in g["processes"]),
        )
        for g in doc["gpus"]
    )
    skip = ("gpus", "problems", "notes", "live_launches", "interfaces", "accounts")
    rest = {k: v for k, v in doc.items() if k not in skip}
    live = doc.get("live_launches")
    return NodeFacts(
        gpus=gpus,
        problems=tuple(doc["problems"]),
        notes=tuple(doc.get("notes", ())),
        live_launches=tuple(live) if isinstance(live, list) else None,
        interfaces=tuple((str(n), str(a)) for n, a in doc.get("interfaces") or ()),
        accounts=_names(doc.get("accounts")),
        **rest,
    )


def parse_probe(text: str) -> NodeFacts:
    """Parse the probe's JSON into ``NodeFacts``; raise ``ProbeError`` when it is not that."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProbeError(f"the probe printed no JSON ({exc.msg}): {text[:120]!r}") from None
    if not isinstance(doc, dict) or doc.get("probe") != 1:
        raise ProbeError("the probe's output has an unknown shape")
    errors: dict[str, str | None] = doc.get("errors") or {}
    names: dict[str, str] = doc.get("process_names") or {}
    problems: list[str] = []
    notes: list[str] = []
    gpus: tuple[GpuFacts, ...] = ()
    source = driver = cuda = None
    if "nvml" in doc:
        source = "nvml"
        gpus = tuple(_nvml_gpu(g, names) for g in doc["nvml"]["gpus"])
        driver, cuda = doc["nvml"].get("driver_version"), doc["nvml"].get("cuda_version")
    elif "nvidia_smi" in doc:
        source = "nvidia-smi"
        gpus = parse_smi(doc["nvidia_smi"]["gpu_csv"], doc["nvidia_smi"].get("apps_csv", ""), names)
        driver = _smi_driver(doc["nvidia_smi"]["gpu_csv"])
        notes.append(f"NVML unavailable ({errors.get('nvml')}); GPU facts from nvidia-smi")
    gpus = _with_owners(gpus, doc.get("process_info") or {})
    module: dict[str, Any] = doc.get("pynvml") or {}
    reading = gpu_reading_words(source, module, errors.get("nvml"))
    if source is None:
        problems.append(
            "GPUs not detected: "
            + "; ".join(_explain(k, errors.get(k)) for k in ("nvml", "nvidia_smi") if errors.get(k))
        )
    elif not gpus:
        problems.append(f"GPUs not detected: {source} reports no GPU devices")
    if "sglang_version" in doc and not doc.get("sglang_version"):
        problems.append(f"SGLang not found: {errors.get('sglang') or 'no version reported'}")
    meminfo: dict[str, int] = doc.get("meminfo") or {}
    hugepages = None
    if meminfo.get("HugePages_Total") is not None and meminfo.get("Hugepagesize") is not None:
        hugepages = meminfo["HugePages_Total"] * meminfo["Hugepagesize"]
    return NodeFacts(
        gpus=gpus,
        gpu_source=source,
        gpu_reading=reading,
        pynvml_from=module.get("from"),
        pynvml_version=module.get("version"),
        nvml_error=errors.get("nvml"),
        driver_version=driver,
        cuda_version=cuda,
        host_ram_bytes=meminfo.get("MemTotal"),
        mem_available_bytes=meminfo.get("MemAvailable"),
        hugepages_bytes=hugepages,
        cgroup_limit_bytes=doc.get("cgroup_limit_bytes"),
        cpu_count=doc.get("cpu_count"),
        shm_bytes=doc.get("shm_bytes"),
        os=doc.get("os"),
        kernel=doc.get("kernel"),
        sglang_version=doc.get("sglang_version"),
        problems=tuple(problems),
        notes=tuple(notes),
        live_launches=_live_launches(doc.get("live_launches")),
        interfaces=_interfaces(doc.get("interfaces")),
        accounts=_names(doc.get("accounts")),
    )


def _interfaces(value: Any) -> tuple[tuple[str, str], ...]:
    """The probe's ``[[name, "address/prefix"], …]``, keeping only pairs that parse."""
    found = []
    for pair in value if isinstance(value, list) else []:
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair):
            with contextlib.suppress(ValueError):
                ipaddress.ip_interface(pair[1])
                found.append((pair[0], pair[1]))
    return tuple(found)


def _live_launches(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list):
        return None
    return tuple(sorted({int(v) for v in value if str(v).isdigit()}))


def _with_owners(gpus: tuple[GpuFacts, ...], info: dict[str, Any]) -> tuple[GpuFacts, ...]:
    """The GPUs with each process's launch (``RANKWISE_LAUNCH_ID``) and user, as the probe
    read them from /proc (``process_info``: PID → ``{"launch", "user"}``)."""

    def owner(p: GpuProcess) -> GpuProcess:
        found = info.get(str(p.pid))
        if not isinstance(found, dict):
            return p
        launch = str(found.get("launch") or "")
        user = found.get("user")
        return replace(
            p,
            launch_id=int(launch) if launch.isdigit() else None,
            user=str(user) if user else None,
        )

    return tuple(replace(g, processes=tuple(owner(p) for p in g.processes)) for g in gpus)


def _nvml_gpu(gpu: dict[str, Any], names: dict[str, str]) -> GpuFacts:
    return GpuFacts(
        index=int(gpu["index"]),
        uuid=str(gpu["uuid"]),
        name=str(gpu["name"]),
        memory_total_bytes=int(gpu["memory_total_bytes"]),
        memory_used_bytes=int(gpu["memory_used_bytes"]),
        processes=tuple(
            GpuProcess(int(p["pid"]), names.get(str(p["pid"]), ""), int(p["used_memory_bytes"]))
            for p in gpu.get("processes", [])
        ),
    )


def parse_smi(
    gpu_csv: str, apps_csv: str, names: dict[str, str] | None = None
) -> tuple[GpuFacts, ...]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,...`` and
    ``--query-compute-apps=gpu_uuid,pid,process_name,used_memory`` (csv, noheader, nounits, MiB).

    Raises ``ProbeError`` on a row that does not have those fields.
    """
    names = names or {}
    apps: dict[str, list[GpuProcess]] = {}
    for line in apps_csv.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 4 or not cells[1].isdigit():
            continue
        app_used = int(cells[3]) * MiB if cells[3].isdigit() else 0
        app_name = names.get(cells[1]) or cells[2]
        apps.setdefault(cells[0], []).append(GpuProcess(int(cells[1]), app_name, app_used))
    gpus = []
    for line in gpu_csv.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        try:
            index, uuid, name, total, used = cells[0], cells[1], cells[2], cells[3], cells[4]
            gpus.append(
                GpuFacts(
                    int(index),
                    uuid,
                    name,
                    int(total) * MiB,
                    int(used) * MiB,
                    tuple(apps.get(uuid, [])),
                )  # fmt: skip
            )
        except (IndexError, ValueError):
            raise ProbeError(f"unexpected nvidia-smi row: {line[:120]!r}") from None
    return tuple(gpus)


def _names(value: Any) -> tuple[str, ...] | None:
    """A list of user names as the probe gave it (strings only), None when it gave none."""
    if not isinstance(value, list):
        return None
    return tuple(str(v) for v in value if isinstance(v, str))


def gpu_reading_words(source: str | None, module: dict[str, Any], nvml_error: str | None) -> str:
    """Which source answered for the GPUs and why, e.g. ``NVML, through nvidia-ml-py 13.615.71
    sent by the panel (the node's Python has no pynvml)`` or ``nvidia-smi: NVML did not answer
    (NVMLError_LibraryNotFound: NVML Shared Library Not Found, through …)``.

    ``module`` is the agent's ``pynvml`` answer: ``from`` ("node", "panel" or None), ``version``.
    """
    version = module.get("version")
    if module.get("from") == "panel":
        through = f"nvidia-ml-py {version} sent by the panel (the node's Python has no pynvml)"
    elif module.get("from") == "node":
        through = "the node's pynvml" + (f" (nvidia-ml-py {version})" if version else "")
    else:
        through = "no pynvml: the node's Python has none and the panel sent none"
    if source == "nvml":
        return f"NVML, through {through}"
    why = nvml_error or "no reason given"
    if source == "nvidia-smi":
        return f"nvidia-smi: NVML did not answer ({why}; through {through})"
    return f"neither NVML ({why}; through {through}) nor nvidia-smi answered"


def _smi_driver(gpu_csv: str) -> str | None:
    first = next((line for line in gpu_csv.splitlines() if line.strip()), "")
    cells = [c.strip() for c in first.split(",")]
    return cells[5] if len(cells) > 5 else None


def _explain(source: str, error: str | None) -> str:
    text = error or ""
    if source == "nvidia_smi" and ("No such file" in text or "not found" in text):
        return "nvidia-smi is not installed (no NVIDIA driver?)"
    if source == "nvml" and "ModuleNotFoundError" in text:
        return "the pynvml module (nvidia-ml-py) is not installed"
    label = "NVML" if source == "nvml" else "nvidia-smi"
    return f"{label}: {text.split(': ', 1)[-1] if ': ' in text else text}"


def describe_changes(old: NodeFacts | None, new: NodeFacts) -> list[str]:
    """What changed between two probes, in words, for the node's event list."""
    if old is None:
        return []
    changes = []
    old_gpus = {g.uuid or str(g.index): g for g in old.gpus}
    new_gpus = {g.uuid or str(g.index): g for g in new.gpus}
    for key, gpu in old_gpus.items():
        if key not in new_gpus:
            changes.append(f"GPU {gpu.index} ({gpu.name}, {key}) disappeared")
    for key, gpu in new_gpus.items():
        if key not in old_gpus:
            changes.append(f"GPU {gpu.index} ({gpu.name}, {key}) appeared")
        elif old_gpus[key].memory_total_bytes != gpu.memory_total_bytes:
            changes.append(
                f"GPU {gpu.index} memory total changed: {old_gpus[key].memory_total_bytes:,} → "
                f"{gpu.memory_total_bytes:,} bytes"
            )
    for label, attr in (
        ("host RAM (bytes)", "host_ram_bytes"),
        ("driver", "driver_version"),
        ("CUDA", "cuda_version"),
        ("SGLang", "sglang_version"),
        ("GPU source", "gpu_source"),
        ("kernel", "kernel"),
    ):
        before, after = getattr(old, attr), getattr(new, attr)
        if before != after and after is not None:
            shown = (lambda v: f"{v:,}") if attr == "host_ram_bytes" else str
            changes.append(f"{label} changed: {shown(before) if before is not None else 'unknown'} "
                           f"→ {shown(after)}")  # fmt: skip
    for problem in set(new.problems) - set(old.problems):
        changes.append(f"problem: {problem}")
    for problem in set(old.problems) - set(new.problems):
        changes.append(f"resolved: {problem}")
    return changes
