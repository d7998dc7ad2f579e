"""``manage.py cleanup NODE [--launch ID] [--gpus 0,2] [--include-foreign PID,...] [--yes]
[--json]``: recover stuck GPUs in escalating steps, each with its command, output and
measurements; then each GPU's final state.

Exit 0 when every GPU ends ``free``, 1 when any is ``held`` or ``quarantined`` (or the node did
not answer), 2 for bad input or a refused confirmation. ``--include-foreign`` names other
processes holding the GPUs that may be killed; without ``--yes`` the command asks, naming each.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from django.core.management.base import CommandError, CommandParser

from nodes import ssh
from nodes.domain.launch_plan import PlanError, parse_gpu_list
from nodes.management.cli import OneLineCommand, add_actor_argument, resolve_actor
from nodes.models import Launch, Node
from nodes.models.choices import Role
from nodes.services import holders, teams
from nodes.workflows import cleanup


class Command(OneLineCommand):
    help = "Clean up GPUs step by step: SIGTERM, SIGKILL, strays, defunct, reset, quarantine."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node", help="Node name")
        parser.add_argument("--launch", type=int, help="The launch whose processes to end")
        parser.add_argument("--gpus", help="GPU indexes, e.g. 0,2 (default: the launch's, or all)")
        parser.add_argument(
            "--include-foreign",
            default="",
            help="PIDs of other holders of these GPUs that may be killed, e.g. 4242,4243",
        )
        parser.add_argument("--yes", action="store_true", help="Do not ask for confirmation")
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
        launch = None
        if options["launch"] is not None:
            launch = teams.visible_launches(actor).filter(pk=options["launch"]).first()
            if launch is None:
                raise CommandError(f"no launch #{options['launch']}", returncode=2)
        try:
            if options["gpus"] is not None and not options["gpus"].strip():
                raise ValueError("--gpus is empty: name GPU indexes, or leave the option out")
            gpus = parse_gpu_list(options["gpus"]) if options["gpus"] else None
            foreign = _pids(options["include_foreign"])
        except (PlanError, ValueError) as exc:
            raise CommandError(str(exc), returncode=2) from None
        if not options["yes"]:
            self._confirm(node, launch, gpus, foreign)
        try:
            job = cleanup.request(node, actor=actor, launch=launch, gpus=gpus, foreign_pids=foreign)
        except cleanup.CleanupError as exc:
            raise CommandError(str(exc), returncode=2) from None
        done = cleanup.run(job.pk)
        steps = list(done.steps.all())
        doc = done.to_json()
        if options["json"]:
            self.stdout.write(json.dumps(doc))
        else:
            for s in steps:
                self.stdout.write(f"{s.key}. {s.title}: {s.outcome}")
                if s.command:
                    self.stdout.write(f"   $ {s.command}")
                for line in s.output.splitlines():
                    self.stdout.write(f"   {line}")
            for g in doc["gpus"]:
                self.stdout.write(f"GPU {g['index']}: {g['state']}")
            self.stdout.write(done.message)
        raise SystemExit(0 if done.status == "done" and done.all_free() else 1)

    def _confirm(
        self, node: Node, launch: Launch | None, gpus: list[int] | None, foreign: list[int]
    ) -> None:
        if not sys.stdin.isatty():
            raise CommandError(
                "cleanup kills processes: confirm with --yes when not at a terminal", returncode=2
            )
        try:
            found = holders.inspect(node, launch=launch)
        except ssh.RemoteError as exc:
            raise CommandError(f"{node.name}: {exc.message}") from None
        chosen = gpus or (launch.gpus if launch else [g.index for g in found.gpus])
        self.stdout.write(f"Cleanup of GPU {','.join(map(str, chosen))} on {node.name}:")
        if launch is not None:
            own = [h for h in found.holders if h.launch_id == launch.pk]
            self.stdout.write(f"  ends launch #{launch.pk}'s processes ({len(own)} now):")
            for h in own:
                self.stdout.write(f"    PID {h.pid} ({h.state}): {h.command}")
        holding = {h.pid: h for h in found.holders if set(h.gpus) & set(chosen)}
        for pid in foreign:
            holder = holding.get(pid)
            if holder is None:
                self.stdout.write(f"  PID {pid} holds none of these GPUs: it will not be touched")
            else:
                self.stdout.write(f"  kills PID {pid} (not this launch's): {holder.command}")
        if input("Go on? [y/N] ").strip().lower() not in ("y", "yes"):
            raise CommandError("nothing done", returncode=2)


def _pids(text: str) -> list[int]:
    pids = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if not re.fullmatch(r"[0-9]{1,10}", part) or int(part) < 2:
            raise ValueError(f"--include-foreign: {part!r} is not a process id")
        pids.append(int(part))
    return pids
