"""NVML for a simulated node, with the names and error behaviour of nvidia-ml-py (``pynvml``).

Covers the calls Rankwise uses: init/shutdown, device count, handle by index, name, UUID, PCI
info, memory info, running compute processes, driver and CUDA driver versions. Errors are raised
as ``NVMLError`` subclasses with NVML's codes and strings (nvidia-ml-py's ``pynvml.py``).
Numbers come from the node's ledger, the same source as its ``nvidia-smi``. Every name here is
nvidia-ml-py's, with its parameters and values, and it has every name ``nodes/remote/`` uses
(tests/simfleet/test_pynvml_surface.py checks both against the real module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """An NVML failure; ``NVMLError(code)`` returns the subclass for that code, as upstream does."""

    _classes: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:  # noqa: PYI034
        target = cls._classes.get(value, cls) if cls is NVMLError else cls
        obj: NVMLError = Exception.__new__(target)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"Unknown Error (code {self.value})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _subclass(name: str, code: int) -> type[NVMLError]:
    """``NVMLError_<Name>``: built with no argument (or any), its ``value`` is always ``code``."""

    def new(cls: type[NVMLError], *args: object) -> NVMLError:
        return NVMLError.__new__(cls, code)

    klass = type(name, (NVMLError,), {"__new__": new})
    NVMLError._classes[code] = klass
    return klass


NVMLError_Uninitialized = _subclass("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _subclass("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _subclass("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _subclass("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_DriverNotLoaded = _subclass("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_GpuIsLost = _subclass("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _subclass("NVMLError_Unknown", NVML_ERROR_UNKNOWN)


def nvmlErrorString(result: int) -> str:  # noqa: N802
    return _STRINGS.get(result, "Unknown Error")


@dataclass
class c_nvmlMemory_t:  # noqa: N801
    total: int
    free: int
    used: int


@dataclass
class c_nvmlProcessInfo_t:  # noqa: N801
    pid: int
    usedGpuMemory: int  # noqa: N815
    gpuInstanceId: int = 0xFFFFFFFF  # noqa: N815
    computeInstanceId: int = 0xFFFFFFFF  # noqa: N815


@dataclass
class nvmlPciInfo_t:  # noqa: N801
    busId: str  # noqa: N815
    busIdLegacy: str  # noqa: N815
    domain: int = 0
    bus: int = 0
    device: int = 0


@dataclass(frozen=True)
class _Handle:
    index: int


_init_count = 0


def _require_init() -> None:
    if _init_count <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def nvmlInit() -> None:  # noqa: N802
    global _init_count
    from simnode import state

    if state.has_fault("no-driver"):
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    if state.has_fault("no-nvml"):
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    _init_count += 1


def nvmlInitWithFlags(flags: int) -> None:  # noqa: N802
    nvmlInit()


def nvmlShutdown() -> None:  # noqa: N802
    global _init_count
    _require_init()
    _init_count -= 1


def _gpus() -> list[Any]:
    from simnode import gpus

    return gpus.view()


def _gpu(handle: _Handle) -> Any:
    _require_init()
    if not isinstance(handle, _Handle):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    found = _gpus()
    if not 0 <= handle.index < len(found):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return found[handle.index]


def nvmlDeviceGetCount() -> int:  # noqa: N802
    _require_init()
    from simnode import state

    return len(state.config()["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:  # noqa: N802
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(index)


def nvmlDeviceGetName(handle: _Handle) -> str:  # noqa: N802
    return str(_gpu(handle).name)


def nvmlDeviceGetUUID(handle: _Handle) -> str:  # noqa: N802
    return str(_gpu(handle).uuid)


def nvmlDeviceGetIndex(handle: _Handle) -> int:  # noqa: N802
    return int(_gpu(handle).index)


def nvmlDeviceGetPciInfo(handle: _Handle) -> nvmlPciInfo_t:  # noqa: N802
    bus_id = str(_gpu(handle).pci_bus_id)
    return nvmlPciInfo_t(busId=bus_id, busIdLegacy=bus_id[4:])


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> c_nvmlMemory_t:  # noqa: N802
    gpu = _gpu(handle)
    return c_nvmlMemory_t(total=gpu.total_bytes, free=gpu.free_bytes, used=gpu.used_bytes)


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[c_nvmlProcessInfo_t]:  # noqa: N802
    return [c_nvmlProcessInfo_t(p.pid, p.used_bytes) for p in _gpu(handle).processes]


nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses  # noqa: N816


def nvmlDeviceGetGraphicsRunningProcesses(handle: _Handle) -> list[c_nvmlProcessInfo_t]:  # noqa: N802
    _gpu(handle)
    return []


def nvmlSystemGetDriverVersion() -> str:  # noqa: N802
    _require_init()
    from simnode import state

    return str(state.config()["driver_version"])


def nvmlSystemGetCudaDriverVersion() -> int:  # noqa: N802
    _require_init()
    from simnode import state

    major, minor = str(state.config()["cuda_version"]).split(".")[:2]
    return int(major) * 1000 + int(minor) * 10


nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion  # noqa: N816
