"""``manage.py place PROFILE[@REV] [--json]``: every node and GPU set where the revision fits
now, best first, and why each other node does not.

Exit status: 0 when it fits somewhere, 1 when nowhere, 2 for bad input (unknown profile,
revision or actor). The fleet is as the panel last read it (the heartbeat's readings)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from nodes.domain.units import format_bytes
from nodes.management.cli import OneLineCommand, add_actor_argument, resolve_actor
from nodes.models.choices import Role
from nodes.services import placement
from nodes.workflows import launching
from nodes.workflows.launching import LaunchInputError


class Command(OneLineCommand):
    help = "Where can this profile revision run now? Candidates best first, refusals with why."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("profile", help="NAME (latest revision) or NAME@REV; ad-hoc too")
        parser.add_argument("--json", action="store_true", help="Print only one JSON document")
        add_actor_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            actor = resolve_actor(options["actor"], Role.VIEWER)
            revision = launching.resolve_profile(options["profile"], actor)
        except (CommandError, LaunchInputError) as exc:
            raise CommandError(str(exc), returncode=2) from None
        # A command may wait on the nodes: the model is read in place where not read lately.
        found = placement.place(revision, actor, wait=None)
        if options["json"]:
            self.stdout.write(json.dumps(found.to_json()))
        else:
            self._print(found)
        if not found.candidates:
            raise SystemExit(1)

    def _print(self, found: placement.Placement) -> None:
        if not found.candidates:
            self.stdout.write(f"{found.revision} fits nowhere now.")
        for rank, c in enumerate(found.candidates, 1):
            gpus = ",".join(str(i) for i in c.gpus)
            left = format_bytes(c.headroom_bytes, "GB")
            self.stdout.write(f"{rank}. {c.node} GPU {gpus}: {c.verdict}, {left} host RAM left")
            for reason in c.reasons:
                self.stdout.write(f"     {reason}")
        for r in found.refused:
            self.stdout.write(f"✗ {r.node}: {'; '.join(r.reasons)}")
