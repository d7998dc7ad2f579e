"""``manage.py gpus NODE [--json]``: who holds the node's GPUs now (changes nothing).

``--json`` prints only ``{"gpus": [{"index", "state" (free/held/quarantined),
"memory_used_bytes", "orphaned_bytes", "holders": [{"pid", "ppid", "state", "command",
"launch_id", "team_only"}], "quarantine_reason"}], "host": {...}, "source": "nvml" |
"nvidia-smi" | null, "reading": which answered and why, in words}``. A holder of a team-only
launch the acting user (``--actor``) may not see says only ``team_only``: no launch id, no
command, as on the node page. Reading a node runs a command on it, so it needs an operator, as
the API's ``/nodes/NAME/gpus`` does (a viewer sees the last stored reading on the node page).
Exit 0; 1 when the node does not answer; 2 for an unknown node or an actor below operator.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from nodes import ssh
from nodes.domain.units import format_bytes
from nodes.management.cli import OneLineCommand, add_actor_argument, resolve_actor
from nodes.models import Node
from nodes.models.choices import Role
from nodes.services import holders, teams


class Command(OneLineCommand):
    help = "Inspect a node's GPUs: memory, holders (NVML and /dev/nvidia*), quarantine, host."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node", help="Node name")
        parser.add_argument("--json", action="store_true", help="Print only one JSON document")
        add_actor_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            actor = resolve_actor(options["actor"], Role.OPERATOR)
        except CommandError as exc:
            raise CommandError(str(exc), returncode=2) from None
        node = Node.objects.filter(name=options["node"]).first()
        if node is None:
            raise CommandError(f"no node named {options['node']!r}", returncode=2)
        try:
            found = holders.inspect(node)
        except ssh.RemoteError as exc:
            raise CommandError(f"{node.name}: {exc.message}") from None
        teams.mask_holders(actor, found.holders)
        if options["json"]:
            self.stdout.write(json.dumps(found.to_json()))
            return
        if found.reading:
            self.stdout.write(f"GPUs read by {found.reading}")
        for gpu in found.gpus:
            line = (
                f"GPU {gpu.index}: {gpu.state}, {format_bytes(gpu.memory_used_bytes, 'GiB')} "
                f"of {format_bytes(gpu.memory_total_bytes, 'GiB')} used"
            )
            if gpu.orphaned_bytes:
                line += f", {format_bytes(gpu.orphaned_bytes, 'GiB')} with no process"
            if gpu.quarantine_reason:
                line += f" — {gpu.quarantine_reason}"
            self.stdout.write(line)
            for h in gpu.holders:
                owner = (
                    "a team-only launch"
                    if h.team_only
                    else f"launch #{h.launch_id}"
                    if h.launch_id
                    else "not Rankwise's"
                )
                self.stdout.write(
                    f"  PID {h.pid} (PPID {h.ppid}, state {h.state}, {owner}): {h.command}"
                )
        host = found.host
        self.stdout.write(
            f"host: MemAvailable {format_bytes(host.get('mem_available_bytes') or 0, 'GB')} of "
            f"{format_bytes(host.get('mem_total_bytes') or 0, 'GB')}, Mlocked "
            f"{format_bytes(host.get('mlocked_bytes') or 0, 'GB')}, /dev/shm "
            f"{format_bytes(host.get('shm_bytes') or 0, 'GB')} in {len(host['shm_files'])} files"
        )
