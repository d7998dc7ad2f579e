"""A multi-node rank's distributed init after the store rendezvous, in the order SGLang runs it
(``init_distributed_environment`` then ``initialize_model_parallel``; simfleet/multinode-sources.md,
"After the store"):

1. the world group's Gloo group: ``GLOO_SOCKET_IFNAME`` looked up (Gloo's ``Unable to find address
   for``), then ``connectFullMesh``: every rank publishes its address in the store and waits for
   every other rank's, in rank order, for SGLang's Gloo timeout (2 hours);
2. the TP group's PyNccl communicator: its rank 0 gets NCCL's unique id, broadcast over the TP
   group's Gloo group, then every rank ``ncclCommInitRank``: NCCL's bootstrap looks up
   ``NCCL_SOCKET_IFNAME`` (``Bootstrap : no socket interface found``), checks in with the root
   and waits for every rank (no timeout: a hang), and ``initTransportsRank`` compares the NCCL
   versions of all ranks (``ncclInvalidUsage`` on every rank when one differs).

Every wait here is in torch's, Gloo's or NCCL's C++ code, where Python runs no signal handler: a
SIGTERM waits until it returns. Single-node launches do not come here.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import sglang
from sglang._standin import netif
from sglang._standin.launch import Launch
from sglang._standin.log import Log
from sglang._standin.store import StoreError, StoreGone

GLOO_TIMEOUT_S = 120 * 60  # GroupCoordinator(gloo_timeout=timedelta(seconds=120 * 60))
# Process groups are named by a counter: the default group "0", the world group's NCCL group
# "1" and its Gloo group "2" (distributed_c10d.py ``_process_group_name``).
WORLD_GLOO_GROUP = "2"
# The NCCL each SGLang release runs: the one its pinned torch wheel requires (sources page).
NCCL = {
    "0.4.10.post2": (2, 26, 2),
    "0.5.2": (2, 27, 3),
    "0.5.9": (2, 27, 5),
    "0.5.23": (2, 30, 7),
}
PYNCCL = "distributed/device_communicators/pynccl_wrapper.py"
INVALID_USAGE = "NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)"
POLL_S = 0.05


def run(launch: Launch, rank: int, log: Log) -> None:
    """After the store rendezvous; raises StoreError with the words the failing layer uses."""
    with _in_native_code():
        me = launch.first_rank + rank
        _world_gloo_group(launch, me)
        if launch.tp > 1:
            _tp_pynccl(launch, rank, me, log)


@contextmanager
def _in_native_code() -> Iterator[None]:
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def nccl_version() -> tuple[int, int, int]:
    return NCCL.get(sglang.__version__, (2, 27, 5))


def _version_code(version: tuple[int, int, int]) -> int:
    """NCCL_VERSION_CODE: X × 10000 + Y × 100 + Z (nccl.h, from 2.9)."""
    major, minor, patch = version
    return major * 10000 + minor * 100 + patch


def _world_gloo_group(launch: Launch, me: int) -> None:
    ifname = os.environ.get("GLOO_SOCKET_IFNAME")
    missing = netif.gloo_missing(ifname) if ifname else None
    if missing is not None:
        # torch/csrc/distributed/c10d/init.cpp → gloo/transport/tcp/device.cc lookupAddrForIface
        raise StoreError(
            "RuntimeError",
            "[enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/device.cc:84] "
            f"ifa != nullptr. Unable to find address for: {missing}",
        )
    client = launch.client
    key = f"gloo/{WORLD_GLOO_GROUP}/" + "{}"
    client.set(key.format(me), 1)
    for peer in range(launch.world):  # gloo/transport/tcp/context.cc: wait_get in rank order
        started = time.monotonic()
        while client.get([key.format(peer)])[0] is None:
            if time.monotonic() - started > GLOO_TIMEOUT_S / launch.speed:
                raise StoreError(
                    "torch.distributed.DistStoreError",
                    f"wait timeout after {GLOO_TIMEOUT_S * 1000}ms, keys: "
                    f"/default_pg/{WORLD_GLOO_GROUP}//cpu//{peer}",
                )
            time.sleep(POLL_S)


def _tp_pynccl(launch: Launch, rank: int, me: int, log: Log) -> None:
    base = me // launch.tp * launch.tp
    group = range(base, base + launch.tp)
    device = launch.device_ids[rank]
    client = launch.client
    unique_id = f"ncclid/{base}"
    if me == base:
        _bootstrap_net(device, log)  # ncclGetUniqueId
        client.set(unique_id, 1)
    else:
        # dist.broadcast over the TP group's Gloo group: a peer that dies closes its pair.
        try:
            while client.get([unique_id])[0] is None:
                time.sleep(POLL_S)
        except StoreGone:
            host = launch.dist_init_addr.rpartition(":")[0].strip("[]")
            raise StoreError(
                "RuntimeError",
                "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
                f"peer [{host}]:{random.randint(32768, 60999)}",
                PYNCCL,
            ) from None
        _bootstrap_net(device, log)  # ncclCommInitRank → ncclInit
    # ncclCommInitRank: check in with the root, all-gather every rank's peer info.
    mine = _version_code(nccl_version())
    client.set(f"nccl/{base}/{me}", mine)
    codes = _all_or_hang(launch, [f"nccl/{base}/{r}" for r in group])
    # The all-gather returns on every rank together: wait until each has its copy.
    client.set(f"nccl-seen/{base}/{me}", 1)
    deadline = time.monotonic() + 5.0
    try:
        while None in client.get([f"nccl-seen/{base}/{r}" for r in group]):
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
    except StoreGone:
        pass
    if any(code != mine for code in codes):  # init.cc initTransportsRank
        raise StoreError("RuntimeError", INVALID_USAGE, PYNCCL)


def _all_or_hang(launch: Launch, keys: list[str]) -> list[int]:
    """NCCL's bootstrap: the root waits for every rank to check in, without a timeout; a rank
    whose root is gone waits for ever too."""
    while True:
        try:
            values = launch.client.get(keys)
        except StoreGone:
            while True:
                time.sleep(3600)
        if None not in values:
            return [int(v) for v in values]
        time.sleep(POLL_S)


def _bootstrap_net(device: int, log: Log) -> None:
    """bootstrap.cc ``bootstrapNetInit``: the interface named by NCCL_SOCKET_IFNAME, or
    ``ncclInvalidUsage``. NCCL says why only at NCCL_DEBUG=WARN or above."""
    value = os.environ.get("NCCL_SOCKET_IFNAME", "")
    if len(value) <= 1:
        return
    level = os.environ.get("NCCL_DEBUG", "").upper()
    who = f"{socket.gethostname().split('.')[0]}:{os.getpid()}:{os.getpid()} [{device}]"
    if level in ("INFO", "TRACE"):
        log.raw(f"{who} NCCL INFO NCCL_SOCKET_IFNAME set by environment to {value}\n")
    if netif.nccl_matches(value):
        return
    if level in ("WARN", "INFO", "ABORT", "TRACE"):
        log.raw(f"\n{who} bootstrap.cc:229 NCCL WARN Bootstrap : no socket interface found\n")
    raise StoreError("RuntimeError", INVALID_USAGE, PYNCCL)
