"""The panel's copy of NVML's Python binding, sent to nodes whose Python has none.

``pynvml.py`` is one pure-Python file of the ``nvidia-ml-py`` distribution (NVIDIA's own
binding, pinned in ``requirements.txt``); it talks to ``libnvidia-ml.so.1``, which every NVIDIA
driver installs. A node with a driver but no ``nvidia-ml-py`` would otherwise read its GPUs only
through ``nvidia-smi``; with this, NVML answers there too and nothing is installed on the node.

The payload goes on the agent's stdin (``python3 -c AGENT --pynvml COMMAND …``): one JSON line
``{"version": V, "sha256": H, "bytes": N}``, then the file compressed with zlib (about 50 kB for
nvidia-ml-py 13.615.71's 332 kB). The agent imports it only when ``import pynvml`` fails there.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import zlib
from dataclasses import dataclass

DISTRIBUTION = "nvidia-ml-py"


@dataclass(frozen=True)
class Pynvml:
    """nvidia-ml-py's ``pynvml.py`` as installed with the panel: ``version`` of the
    distribution, ``sha256`` of the file (hex), the ``payload`` the agent reads on stdin."""

    version: str
    sha256: str
    payload: bytes


@functools.cache
def pynvml() -> Pynvml | None:
    """The panel's nvidia-ml-py, read once; None when it is not installed (the agent then reads
    GPUs without NVML where the node has no binding of its own)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
        source = dist.locate_file("pynvml.py").read_bytes()  # type: ignore[attr-defined]
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None
    digest = hashlib.sha256(source).hexdigest()
    header = {"version": dist.version, "sha256": digest, "bytes": len(source)}
    payload = json.dumps(header).encode() + b"\n" + zlib.compress(source, 9)
    return Pynvml(version=dist.version, sha256=digest, payload=payload)
