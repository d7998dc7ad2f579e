"""``manage.py capacity LAUNCH_ID [--json] [--actor NAME]``: what bounds a running server and
what would lift it, each option checked by the budget on its node (``services.capacity``).

``--json`` prints only ``{"launch", "bottleneck", "held_s", "figures", "options": [{"change",
"verdict", "expected_running_requests", "expected_throughput_change", "why"}], "why"}``. Exit 0;
2 for a launch that does not exist or the actor may not see."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from nodes.domain import figure_labels
from nodes.domain.remedy import describe
from nodes.management.cli import OneLineCommand, add_actor_argument, resolve_actor
from nodes.models.choices import Role
from nodes.services import capacity
from nodes.services.teams import visible_launches


class Command(OneLineCommand):
    help = "What bounds a running server's capacity, and the checked changes that would lift it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("launch", type=int, help="The launch's id")
        parser.add_argument("--json", action="store_true", help="Print only one JSON document")
        add_actor_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            actor = resolve_actor(options["actor"], Role.VIEWER)
        except CommandError as exc:
            raise CommandError(str(exc), returncode=2) from None
        launch = (
            visible_launches(actor)
            .select_related("node", "revision__profile")
            .filter(pk=options["launch"])
            .first()
        )
        if launch is None:
            raise CommandError(f"no launch #{options['launch']}", returncode=2)
        found = capacity.capacity_of(launch)
        if options["json"]:
            self.stdout.write(json.dumps(found))
            return
        held = f" (held {found['held_s']:g} s)" if found["held_s"] else ""
        self.stdout.write(f"Launch #{launch.pk}: {found['bottleneck']}{held}")
        for key, value in found["figures"].items():
            self.stdout.write(f"  {figure_labels.label(key)}: {figure_labels.value(key, value)}")
        if found["why"]:
            self.stdout.write(f"  {found['why']}")
        for option in found["options"]:
            self.stdout.write(
                f"  option: {describe(option['change'])} ({option['verdict']}): "
                f"{option['expected_running_requests']} running, "
                f"×{option['expected_throughput_change']:g} throughput — {option['why']}"
            )
