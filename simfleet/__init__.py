"""simfleet: simulated GPU nodes that look real over SSH, for tests, demos and benchmarks.

Each node is its own host (network, mount, PID and UTS namespaces) running a real OpenSSH sshd,
with simulated GPUs (``nvidia-smi``, a ``pynvml`` module, ``/dev/nvidia*``), simulated host RAM
(``/proc/meminfo``, ``free``), its own ``/dev/shm`` and kernel log, and an SGLang stand-in whose
memory arithmetic is written independently of Rankwise's from ``shared/reference/sglang.md``.
simfleet never imports ``nodes``. Stdlib only, so the nodes' own ``python3`` can run it.
"""
