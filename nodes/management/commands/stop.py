"""``manage.py stop ID [--json]``: stop a launch through the workers and wait for the result.

Exit 0 once the processes are gone and the reservation is released; 1 with what did not come
back (processes still alive, GPU memory still held) or when the node did not answer.
"""

from __future__ import annotations

import json
from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout
from django.core.management.base import CommandError, CommandParser

from nodes.management.cli import OneLineCommand, add_actor_argument, resolve_actor
from nodes.models.choices import LaunchStatus, Role
from nodes.queue import QueueUnavailable, send
from nodes.services import teams

STOP_WAIT_S = 300


class Command(OneLineCommand):
    help = "Stop a launch: SIGTERM, then SIGKILL; verify processes and GPU memory are gone."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("id", type=int)
        parser.add_argument("--json", action="store_true", help="Print only one JSON document")
        add_actor_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        actor = resolve_actor(options["actor"], Role.OPERATOR)
        launch = teams.visible_launches(actor).filter(pk=options["id"]).first()
        if launch is None:
            raise CommandError(f"no launch #{options['id']}", returncode=2)
        try:
            result = send("nodes.stop_launch", launch.pk, actor.pk).get(timeout=STOP_WAIT_S)
        except QueueUnavailable as exc:
            raise CommandError(f"{exc}; nothing was stopped") from None
        except CeleryTimeout:
            launch.refresh_from_db()
            if launch.status == LaunchStatus.STOPPING and launch.reason:
                raise CommandError(f"launch #{launch.pk}: {launch.reason}") from None
            raise CommandError(
                f"no worker finished the stop within {STOP_WAIT_S} s: is the panel running?"
            ) from None
        launch.refresh_from_db()
        doc = {**launch.summary(), **result}
        clean = not result["remaining"] and not result["held_gpus"] and not result["error"]
        if options["json"]:
            self.stdout.write(json.dumps(doc))
        else:
            self.stdout.write(f"launch #{launch.pk} {launch.status}: {launch.reason}")
            if result["error"]:
                self.stdout.write(f"  {result['error']}")
            if result["held_gpus"] or result["remaining"]:
                self.stdout.write(
                    f"  not everything came back: manage.py cleanup {launch.node.name} "
                    f"--launch {launch.pk} goes on (strays, defunct, GPU reset, quarantine)"
                )
        raise SystemExit(0 if clean else 1)
