"""On a real GPU node: an orphaned process holding GPU memory is found and freed.

Run on the GPU machine itself, from a checkout of Rankwise (stdlib only; NVML through
``pynvml`` when installed, else ``nvidia-smi``):

    python3 tests/manual/gpu_orphan.py [--gpu 0] [--mib 2048]

1. A parent process forks a child that allocates MIB of GPU memory through the CUDA driver API
   (``libcuda.so.1``: cuInit, cuCtxCreate, cuMemAlloc) and sleeps; the parent is then killed,
   so the child is orphaned (re-parented to PID 1 or the nearest subreaper).
2. Rankwise's node agent (``nodes/remote/agent.py``) inspects the node, and
   ``nodes.domain.gpu_holders`` classifies the holders: the orphan must be found on the GPU,
   with its PPID, state and command.
3. The cleanup step for a named foreign holder (SIGTERM, then SIGKILL; ``agent signal``) ends
   it, and NVML must show the memory back within 10 s.

It prints each reading and exits 0 when all three hold; the output belongs in
benchmarks/RESULTS.md. It needs a GPU, so CI does not run it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from nodes.domain import gpu_holders as gh  # noqa: E402
from nodes.remote import agent  # noqa: E402


def used_mib(index: int) -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used // 2**20)
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i",
             str(index)], capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return int(out.strip())


def nvml_gpus() -> list[dict]:
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory",
         "--format=csv,noheader,nounits"], capture_output=True, text=True,
    ).stdout  # fmt: skip
    uuids = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,memory.total,memory.used",
         "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    gpus = []
    for line in uuids.strip().splitlines():
        index, uuid, total, used = [v.strip() for v in line.split(",")]
        apps = [a.split(",") for a in out.strip().splitlines() if a.startswith(uuid)]
        gpus.append(
            {
                "index": int(index),
                "memory_total_bytes": int(total) * 2**20,
                "memory_used_bytes": int(used) * 2**20,
                "processes": [
                    {"pid": int(pid), "name": "", "used_memory_bytes": int(mib) * 2**20}
                    for _, pid, mib in (tuple(v.strip() for v in a) for a in apps)
                ],
            }
        )
    return gpus


def hold(index: int, mib: int, ready_fd: int) -> None:
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0, "cuInit failed"
    device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    assert cuda.cuDeviceGet(ctypes.byref(device), index) == 0
    assert cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device) == 0
    assert cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(mib * 2**20)) == 0
    os.write(ready_fd, b"1")
    while True:
        time.sleep(60)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--mib", type=int, default=2048)
    args = parser.parse_args()
    before = used_mib(args.gpu)
    print(f"GPU {args.gpu} before: {before} MiB used")
    read_fd, write_fd = os.pipe()
    parent = os.fork()
    if parent == 0:
        os.setsid()
        if os.fork() == 0:
            hold(args.gpu, args.mib, write_fd)
        time.sleep(3600)
        os._exit(0)
    os.read(read_fd, 1)
    os.kill(parent, signal.SIGKILL)
    os.waitpid(parent, 0)
    time.sleep(1)
    held = used_mib(args.gpu)
    print(f"GPU {args.gpu} with the orphan: {held} MiB used (+{held - before})")

    raw = agent.holders([])
    found = gh.holders(raw["processes"], nvml_gpus(), {})
    # The orphan kept the session its killed parent made (setsid): that is how it is told apart.
    orphans = [h for h in found if args.gpu in h.gpus and h.sid == parent]
    for h in orphans:
        print(f"inspect: PID {h.pid} PPID {h.ppid} state {h.state} via {h.seen_by}: {h.command}")
    states = gh.gpu_states(nvml_gpus(), found, {})
    print(json.dumps(states[args.gpu].to_json()))
    if not orphans:
        print("FAIL: inspect did not find the orphan")
        return 1

    answer = agent.send("TERM", 10, [str(h.pid) for h in orphans])
    if answer["remaining"]:
        answer = agent.send("KILL", 5, [str(h.pid) for h in orphans])
    print(f"cleanup: {json.dumps(answer)}")
    deadline = time.monotonic() + 10
    after = used_mib(args.gpu)
    while after > before + 64 and time.monotonic() < deadline:
        time.sleep(0.5)
        after = used_mib(args.gpu)
    print(f"GPU {args.gpu} after cleanup: {after} MiB used (NVML)")
    return 0 if after <= before + 64 else 1


if __name__ == "__main__":
    raise SystemExit(main())
