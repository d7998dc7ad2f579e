"""A foreign process holding GPU memory (``simfleet hold``), until ``simfleet release``.

Run inside the node: ``python3 -m simnode.hold --gpu I --bytes N`` holds; ``--release`` ends
every hold on the node.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time

from simnode import state


def main() -> None:
    parser = argparse.ArgumentParser(prog="simnode.hold")
    parser.add_argument("--gpu", type=int)
    parser.add_argument("--bytes", type=int)
    parser.add_argument("--release", action="store_true")
    args = parser.parse_args()
    holds = state.path("holds")
    if args.release:
        for name in os.listdir(holds):
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(name), signal.SIGTERM)
        return
    device = open(f"/dev/nvidia{args.gpu}", "rb")  # noqa: SIM115  (held open, as CUDA does)
    marker = os.path.join(holds, str(os.getpid()))
    signal.signal(
        signal.SIGTERM,
        lambda *_: (state.release_mine(), os.unlink(marker), os._exit(0)),  # type: ignore[func-returns-value]
    )
    state.update_mine(name="python3", gpu={str(args.gpu): args.bytes})
    open(marker, "w").close()
    try:
        while True:
            time.sleep(3600)
    finally:
        device.close()


if __name__ == "__main__":
    main()
