"""``python -m simfleet up|down|status|reboot|link|rekey|hold|release|load --state DIR``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from simfleet.fleet import Fleet, FleetError
from simfleet.sizes import parse_size
from simfleet.spec import FAULTS, from_options, load_spec_file


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simfleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text)
        p.add_argument("--state", required=True, help="Folder holding the fleet's state.")
        return p

    up = command("up", "Start the fleet (safe to repeat); print its nodes.")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--gpus", type=int)
    up.add_argument("--gpu-name")
    up.add_argument("--gpu-memory", help="Per GPU, with unit: 141GiB")
    up.add_argument("--host-ram", help="With unit: 449GB")
    up.add_argument("--sglang-version")
    up.add_argument("--cgroup-limit", help="Memory limit the node's processes see, with unit")
    up.add_argument("--speed", type=float, help="Time factor: 2 runs start-up twice as fast")
    up.add_argument("--fault", action="append", choices=FAULTS, default=None)
    up.add_argument("--spec", help='JSON: {"nodes": [{"name":…, "gpus":…, "faults": […]}, …]}')
    up.add_argument("--json", action="store_true", help="Print the fleet as JSON.")

    command("down", "Stop everything the fleet started; remove namespaces and links.")
    status = command("status", "Each node's GPUs and RAM.")
    status.add_argument("--json", action="store_true")
    command("reboot", "Restart one node: processes gone, leaked memory freed.").add_argument("name")
    link = command("link", "Take a node's network link down or up.")
    link.add_argument("name")
    link.add_argument("updown", choices=["up", "down"])
    link.add_argument(
        "--fabric", action="store_true", help="the node's port on the fleet's fabric (eth1)"
    )
    command("rekey", "Give a node a new SSH host key.").add_argument("name")
    hold = command("hold", "A foreign process holds GPU memory until release.")
    hold.add_argument("name")
    hold.add_argument("--gpu", type=int, required=True)
    hold.add_argument("--memory", required=True, help="With unit: 10GiB")
    command("release", "End the node's foreign GPU holds.").add_argument("name")
    load = command("load", "Drive a bounded load at a server on the node; print a summary.")
    load.add_argument("name")
    load.add_argument("--port", type=int, required=True)
    load.add_argument("--concurrency", type=int, required=True, help="Clients at once")
    load.add_argument("--input-tokens", type=int, required=True, help="Per request")
    load.add_argument("--output-tokens", type=int, required=True, help="Per request")
    load.add_argument("--shared-prefix", type=float, default=0.0, help="Share of input, 0–1")
    load.add_argument("--seconds", type=float, required=True, help="Then it stops by itself")
    return parser


def _specs(fleet: Fleet, args: argparse.Namespace) -> list[Any]:
    shared = {
        "gpus": args.gpus,
        "gpu_name": args.gpu_name,
        "gpu_memory": args.gpu_memory,
        "host_ram": args.host_ram,
        "sglang_version": args.sglang_version,
        "cgroup_limit": args.cgroup_limit,
        "speed": args.speed,
        "fault": args.fault,
    }
    entries = load_spec_file(args.spec) if args.spec else [{} for _ in range(args.nodes)]
    specs = []
    for number, entry in enumerate(entries):
        entry = dict(entry)
        name = entry.pop("name", None) or fleet.default_name(number)
        specs.append(from_options(name, {**shared, **entry}))
    return specs


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    fleet = Fleet(args.state)
    try:
        if args.command == "up":
            doc = fleet.up(_specs(fleet, args))
            if args.json:
                print(json.dumps(doc, indent=2))
            else:
                for node in doc["nodes"]:
                    print(f"{node['name']}  root@{node['host']}  {node['host_key_fingerprint']}")
        elif args.command == "down":
            fleet.down()
        elif args.command == "status":
            rows = fleet.status()
            if args.json:
                print(json.dumps({"nodes": rows}, indent=2))
            for row in [] if args.json else rows:
                if not row["running"]:
                    print(f"{row['name']}  {row['host']}  not running")
                    continue
                used = [f"{g['memory_used_bytes'] / 2**30:.1f}" for g in row["gpus"]]
                print(
                    f"{row['name']}  {row['host']}  RAM {row['host_used_bytes'] / 1e9:.1f}/"
                    f"{row['host_ram_bytes'] / 1e9:.0f} GB  GPU used GiB: {' '.join(used)}"
                )
        elif args.command == "reboot":
            fleet.reboot(args.name)
        elif args.command == "link":
            fleet.link(args.name, args.updown, fabric=args.fabric)
        elif args.command == "rekey":
            print(fleet.rekey(args.name))
        elif args.command == "hold":
            fleet.hold(args.name, args.gpu, parse_size(args.memory))
        elif args.command == "release":
            fleet.release(args.name)
        elif args.command == "load":
            summary = fleet.load(
                args.name, args.port, concurrency=args.concurrency,
                input_tokens=args.input_tokens, output_tokens=args.output_tokens,
                shared_prefix=args.shared_prefix, seconds=args.seconds,
            )  # fmt: skip
            print(json.dumps(summary))
    except (FleetError, ValueError) as exc:
        print(f"simfleet: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
