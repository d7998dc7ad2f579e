"""``manage.py node add|list|show``: the node inventory from a shell.

With ``--json`` stdout holds exactly one JSON document (sizes in integer bytes); every message
goes to stderr. Bad input exits 1 with a one-line reason.
"""

from __future__ import annotations

import json
import os
from typing import Any

from django.core.management.base import CommandError, CommandParser

from nodes.choices import Role
from nodes.domain.units import UnitError, format_bytes, split_size
from nodes.forms import NodeForm
from nodes.management.cli import OneLineCommand, OneLineParser, add_actor_argument, resolve_actor
from nodes.models import Node
from nodes.services.inventory import save_node


class Command(OneLineCommand):
    help = "Add, list and show nodes in the inventory."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=OneLineParser)

        add = sub.add_parser("add", help="Register a node by hand.")
        add.add_argument("name")
        add.add_argument("--host", required=True, help="SSH host name or IP address.")
        add.add_argument("--port", type=int, default=22, help="SSH port (default 22).")
        add.add_argument("--user", default="root", help="SSH user (default root).")
        add.add_argument("--key-file", default="", help="Private key file on this host.")
        add.add_argument("--gpus", type=int, default=0, help="Number of GPUs.")
        add.add_argument("--gpu-name", default="", help='GPU model, e.g. "NVIDIA H200".')
        add.add_argument("--gpu-memory", help="Memory per GPU with its unit: 96GiB or 103GB.")
        add.add_argument("--host-ram", help="Host RAM with its unit: 449GB or 418GiB.")
        add.add_argument("--labels", default="", help="Comma-separated labels.")
        add.add_argument("--notes", default="")
        add_actor_argument(add)

        for verb, text in (("list", "List nodes."), ("show", "Show one node.")):
            p = sub.add_parser(verb, help=text)
            if verb == "show":
                p.add_argument("name")
            p.add_argument("--json", action="store_true", help="Print one JSON document.")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "add":
            self.add(options)
        elif action == "list":
            self.list(options)
        else:
            self.show(options)

    def add(self, options: dict[str, Any]) -> None:
        actor = resolve_actor(options["actor"], Role.ADMIN)
        data: dict[str, Any] = {
            "name": options["name"],
            "host": options["host"],
            "port": options["port"],
            "ssh_user": options["user"],
            "key_file": os.path.abspath(options["key_file"]) if options["key_file"] else "",
            "gpu_count": options["gpus"],
            "gpu_name": options["gpu_name"],
            "labels_text": options["labels"],
            "notes": options["notes"],
        }
        data.update(_size_data("gpu_memory", options["gpu_memory"], "--gpu-memory"))
        data.update(_size_data("host_ram", options["host_ram"], "--host-ram"))
        form = NodeForm(data)
        if not form.is_valid():
            raise CommandError(_first_error(form))
        node = save_node(form, actor=actor)
        self.stderr.write(f"Added node {node.name} ({node.gpu_summary()}).")

    def list(self, options: dict[str, Any]) -> None:
        nodes = Node.objects.prefetch_related("gpus")
        if options["json"]:
            self.stdout.write(json.dumps({"nodes": [n.audit_snapshot() for n in nodes]}, indent=2))
            return
        rows = [("NAME", "ADDRESS", "GPUS", "HOST RAM", "STATUS")]
        for n in nodes:
            ram = format_bytes(n.host_ram_bytes, "GB") if n.host_ram_bytes else "unknown"
            address = f"{n.ssh_user}@{n.host}:{n.port}"
            rows.append((n.name, address, n.gpu_summary(), ram, n.status))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))

    def show(self, options: dict[str, Any]) -> None:
        node = Node.objects.prefetch_related("gpus").filter(name=options["name"]).first()
        if node is None:
            raise CommandError(f"no node named {options['name']!r}")
        snapshot = node.audit_snapshot()
        if options["json"]:
            self.stdout.write(json.dumps(snapshot, indent=2))
            return
        ram = format_bytes(node.host_ram_bytes, "GB") if node.host_ram_bytes else "unknown"
        self.stdout.write(f"{node.name}  {node.ssh_user}@{node.host}:{node.port}  [{node.status}]")
        self.stdout.write(f"  GPUs:     {node.gpu_summary()}")
        self.stdout.write(f"  Host RAM: {ram}")
        if node.labels:
            self.stdout.write(f"  Labels:   {', '.join(node.labels)}")


def _size_data(field: str, text: str | None, flag: str) -> dict[str, Any]:
    """Turn ``"96GiB"`` into the size field's two form inputs; a missing unit is an error."""
    if text is None:
        return {}
    try:
        number, unit = split_size(text)
    except UnitError as exc:
        if "unknown unit" in str(exc):
            raise CommandError(f"{flag}: {text!r}: give the size in GB or GiB") from None
        raise CommandError(f"{flag}: {exc}") from None
    if unit not in ("GB", "GiB"):
        raise CommandError(f"{flag}: {text!r}: give the size in GB or GiB, not {unit}")
    return {f"{field}_0": str(number), f"{field}_1": unit}


def _first_error(form: NodeForm) -> str:
    """One line naming the first bad field the way the CLI spells it."""
    flags = {
        "name": "NAME",
        "host": "--host",
        "port": "--port",
        "ssh_user": "--user",
        "key_file": "--key-file",
        "gpu_count": "--gpus",
        "gpu_name": "--gpu-name",
        "gpu_memory": "--gpu-memory",
        "host_ram": "--host-ram",
        "labels_text": "--labels",
    }
    field, errors = next(iter(form.errors.items()))
    return f"{flags.get(field, field)}: {' '.join(str(e) for e in errors)}"
