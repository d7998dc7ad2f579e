"""What the main process learned before spawning ranks; shared with ranks through fork."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from simnode import state

from sglang._standin import args as flags
from sglang._standin.memory import Model


@dataclass
class Launch:
    ns: argparse.Namespace
    version: tuple[int, ...]
    model: Model
    tp: int
    pp: int
    nnodes: int
    ranks: int  # schedulers on this node
    gpu_ids: list[int]  # physical GPU index of each local rank
    device_ids: list[int]  # the index torch sees (after CUDA_VISIBLE_DEVICES)
    barrier_dir: str
    main_pid: int
    speed: float
    leak: bool
    rank_pids: list[int] = field(default_factory=list)
    handles: list[Any] = field(default_factory=list)  # device files a rank keeps open
    # A multi-node launch: this node's --node-rank, the global TP rank of its first local rank,
    # the store's HOST:PORT (--dist-init-addr) and torch's timeout for it (--dist-timeout, s).
    node_rank: int = 0
    first_rank: int = 0
    dist_init_addr: str = ""
    dist_timeout: float = 600.0
    client: Any = None  # this rank's connection to the store (store.Client)

    @property
    def world(self) -> int:
        return self.tp * self.pp

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds / self.speed)

    def flag(self, *names: str, default: Any = None) -> Any:
        return flags.get(self.ns, *names, default=default)

    # --- a file barrier: each rank drops its value, everyone reads all of them ----------------

    def exchange(
        self, phase: str, rank: int, value: float, patience: float | None = None
    ) -> list[float]:
        """Publish ``value`` for ``phase``; wait for every rank's; return them in rank order.

        Like an NCCL collective, it waits for ever when a peer is gone (a hang), unless
        ``patience`` seconds (scaled) pass, when it raises TimeoutError.
        """
        # A rank in a collective sits in NCCL's C code, where Python runs no signal handler: a
        # SIGTERM waits until the collective returns (for ever when a peer is dead).
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            return self._exchange(phase, rank, value, patience)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _exchange(self, phase: str, rank: int, value: float, patience: float | None) -> list[float]:
        if self.client is not None:
            return self._exchange_over_store(phase, rank, value, patience)
        target = os.path.join(self.barrier_dir, f"{phase}.{rank}")
        with open(target + ".tmp", "w") as handle:
            json.dump(value, handle)
        os.replace(target + ".tmp", target)
        started = time.monotonic()
        while True:
            values = []
            for peer in range(self.ranks):
                try:
                    with open(os.path.join(self.barrier_dir, f"{phase}.{peer}")) as handle:
                        values.append(float(json.load(handle)))
                except (FileNotFoundError, ValueError):
                    break
            if len(values) == self.ranks:
                return values
            if patience is not None and time.monotonic() - started > patience / self.speed:
                raise TimeoutError(phase)
            time.sleep(0.02)

    def _exchange_over_store(
        self, phase: str, rank: int, value: float, patience: float | None
    ) -> list[float]:
        """The exchange of a multi-node launch: every rank of every node, by global rank."""
        self.client.ask({"set": f"{phase}.{self.first_rank + rank}", "value": value})
        started = time.monotonic()
        while True:
            values = self.client.ask({"phase": phase, "n": self.world})
            if values is not None:
                return [float(v) for v in values]
            if patience is not None and time.monotonic() - started > patience / self.speed:
                raise TimeoutError(phase)
            time.sleep(0.02)


def leak_on_crash() -> bool:
    return state.has_fault("leak-on-crash")
