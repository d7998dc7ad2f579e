"""One JSON document with the node's GPUs and memory, as its own tools report them."""

from __future__ import annotations

import json
import sys

from simnode import gpus, state


def main() -> None:
    conf = state.config()
    live = state.entries()
    doc = {
        "host_ram_bytes": conf["host_ram_bytes"],
        "host_used_bytes": state.host_used_bytes(live),
        "leaked_host_bytes": sum(e.get("host_bytes", 0) for e in state.leaked()),
        "faults": conf.get("faults", []),
        "sglang_version": conf["sglang_version"],
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "memory_total_bytes": g.total_bytes,
                "memory_used_bytes": g.used_bytes,
                "processes": [p.pid for p in g.processes],
            }
            for g in gpus.view()
        ],
    }
    json.dump(doc, sys.stdout)


if __name__ == "__main__":
    main()
