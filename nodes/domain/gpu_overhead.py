"""Free GPU memory before SGLang loads weights: the card's size less the CUDA context, NCCL and
custom all-reduce buffers, less what other processes hold.

SGLang measures it after ``init_torch_distributed`` (``Load weight begin. avail mem=``, GiB, the
minimum over ranks, shared/reference/sglang.md §3). Figures it was fitted to (card total from
``nvidia-smi``, minus the logged ``avail mem``):

* RTX PRO 6000 Blackwell (102,641,958,912 B = 95.59 GiB), TP8, ``--disable-custom-all-reduce``:
  94.62 GiB free → 0.97 GiB (S01).
* RTX 4090 (24,564 MiB = 23.99 GiB), TP2 over PCIe: 22.93 GiB free → 1.06 GiB
  (kv-observations K28).
* H200 (143,771 MiB = 140.40 GiB), TP8 with NVLink and the custom all-reduce on: 137.34 GiB
  free → 3.06 GiB; its log says ``Init torch distributed ends. mem usage=1.96 GB``
  (kv-observations K03).

The only exact figure is a launch's own ``Load weight begin`` line: calibration replaces this.
"""

from __future__ import annotations

from nodes.domain.units import GiB

CUDA_CONTEXT_BYTES = int(0.6 * GiB)
NCCL_BYTES = int(0.4 * GiB)  # TP > 1
CUSTOM_ALL_REDUCE_BYTES = 2 * GiB  # NVLink datacenter GPUs, TP > 1, custom all-reduce on
#: GPU names (as nvidia-smi prints them) where SGLang's custom all-reduce runs over NVLink.
NVLINK_CLASSES = ("H100", "H200", "H20", "H800", "A100", "A800", "B200", "B300", "GB200", "GB300")


def overhead_bytes(gpu_name: str | None, tp: int, *, custom_all_reduce: bool = True) -> int:
    """Bytes per GPU taken before the weights: context, plus NCCL and all-reduce under TP."""
    total = CUDA_CONTEXT_BYTES
    if tp > 1:
        total += NCCL_BYTES
        name = (gpu_name or "").upper()
        if custom_all_reduce and any(c in name.split() for c in NVLINK_CLASSES):
            total += CUSTOM_ALL_REDUCE_BYTES
    return total
