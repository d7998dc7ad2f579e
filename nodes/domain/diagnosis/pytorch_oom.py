"""PyTorch's CUDA out-of-memory text (``c10/cuda/CUDACachingAllocator.cpp``) in the two forms a
launch log has it, before and since PyTorch 2.1, and the sizes it gives (GiB): read by the rules
for GPU memory that another process holds (``gpu_holders``) and for CUDA-graph capture
(``gpu_memory``)."""

from __future__ import annotations

import re

from nodes.domain.diagnosis.evidence import _num

# PyTorch's allocator text (c10/cuda/CUDACachingAllocator.cpp) since 2.1: the sizes go through
# format_size (bytes, KiB, MiB, GiB), 2.1 spelled "capacty", and the "Process N has" entries come
# in NVML's order, this process's own ("Including non-PyTorch memory, this process has") among
# them.
_SIZE = r"[\d.]+ (?:bytes|[KMGT]iB)"
OOM_WITH_HOLDER = re.compile(
    rf"(?:CUDA|HIP) out of memory\. Tried to allocate (?P<tried>{_SIZE})\. GPU (?P<gpu>\d+) has a "
    rf"total capaci?ty of (?P<total>{_SIZE}) of which (?P<free>{_SIZE}) is free\. "
    rf"(?P<processes>(?:(?:Including non-PyTorch memory, this process|Process \d+) has {_SIZE} "
    r"memory in use\. ?)*Process \d+ has .*)"
)
# The sizes alone (the same text up to "is free"), CUDA or HIP: what every OOM rule reads.
OOM_SINCE_2_1 = re.compile(
    rf"(?:CUDA|HIP) out of memory\. Tried to allocate (?P<tried>{_SIZE})\. GPU (?P<gpu>\d+) has "
    rf"a total capaci?ty of (?P<total>{_SIZE}) of which (?P<free>{_SIZE}) is free"
)
OTHER_PROCESS = re.compile(rf"\bProcess (?P<pid>\d+) has (?P<used>{_SIZE}) memory in use")
_UNITS = {"bytes": 2**-30, "KiB": 2**-20, "MiB": 2**-10, "GiB": 1.0, "TiB": 2**10}


def gib_of(size: str) -> float:
    """``"512.00 MiB"`` → 0.5 (GiB); PyTorch's format_size units (bytes, KiB … TiB)."""
    value, unit = size.split()
    return _num(value) * _UNITS[unit]


# The same allocator's text before PyTorch 2.1: no list of processes, only this process's own
# figures, the free memory and the sizes in format_size's units ("0 bytes free"); with a memory
# fraction set it adds "N allowed".
OOM_BEFORE_2_1 = re.compile(
    rf"(?:CUDA|HIP) out of memory\. Tried to allocate (?P<tried>{_SIZE}) \(GPU (?P<gpu>\d+); "
    rf"(?P<total>{_SIZE}) total capacity; (?P<allocated>{_SIZE}) already allocated; "
    rf"(?P<free>{_SIZE}) free; (?:{_SIZE} allowed; )?(?P<reserved>{_SIZE}) reserved in total "
    r"by PyTorch\)"
)
#: Memory on the card outside this process's PyTorch that is still this process's own (the CUDA
#: context, NCCL's and cuBLAS's buffers) stays below this share of the card, and below
#: ``OUTSIDE_MIN_GIB``; more than both is another holder's.
OUTSIDE_SHARE = 0.10
OUTSIDE_MIN_GIB = 4.0


def oom_figures(match: re.Match[str]) -> dict[str, float]:
    """The sizes of an ``OOM_BEFORE_2_1`` match in GiB: ``tried``, ``total``, ``allocated``,
    ``free``, ``reserved``, and ``outside`` = total − free − reserved (what neither PyTorch in
    this process reserved nor is free)."""
    figures = {k: gib_of(match[k]) for k in ("tried", "total", "allocated", "free", "reserved")}
    figures["outside"] = max(figures["total"] - figures["free"] - figures["reserved"], 0.0)
    return figures
