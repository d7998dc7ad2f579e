"""``dmesg`` for a simulated node: its own kernel ring buffer (OOM-killer lines included)."""

from __future__ import annotations

import sys
import time

from simnode import state


def main(argv: list[str]) -> int:
    human = any(a in ("-T", "--ctime") for a in argv) or any(
        a.startswith("-") and not a.startswith("--") and "T" in a for a in argv
    )
    if any(a in ("-c", "-C", "--clear", "--read-clear") for a in argv):
        open(state.path("kmsg"), "w").close()
        return 0
    boot = float(state.config()["boot_time"])
    try:
        with open(state.path("kmsg")) as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        stamp, _, message = line.partition(" ")
        if human:
            when = time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(boot + float(stamp)))
            sys.stdout.write(f"[{when}] {message}\n")
        else:
            sys.stdout.write(f"[{float(stamp):12.6f}] {message}\n")
    return 0
