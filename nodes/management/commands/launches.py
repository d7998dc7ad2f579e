"""``manage.py launches [--json]``: every launch, newest first, with status and reason."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from nodes.management.cli import OneLineCommand
from nodes.models import Launch


class Command(OneLineCommand):
    help = "List launches, newest first."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON list")

    def handle(self, *args: Any, **options: Any) -> None:
        rows = Launch.objects.select_related("node", "revision__profile")
        if options["json"]:
            self.stdout.write(json.dumps([launch.summary() for launch in rows]))
            return
        for launch in rows:
            self.stdout.write(
                f"#{launch.pk:<5} {launch.status:<9} {launch.node.name:<16} "
                f"GPU {launch.gpu_list():<16} port {launch.port:<6} {launch.revision}"
                + (f"  — {launch.reason[:100]}" if launch.reason else "")
            )
