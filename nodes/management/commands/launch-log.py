"""``manage.py launch-log ID [--follow]``: a launch's stored log lines (secrets masked).

With ``--follow`` it keeps printing new lines until the launch ended and its log is complete.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from django.core.management.base import CommandError, CommandParser

from nodes.domain.log_lines import with_node
from nodes.management.cli import OneLineCommand
from nodes.models import Launch
from nodes.models.choices import LAUNCH_ENDED


class Command(OneLineCommand):
    help = "Print a launch's log lines as stored."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("id", type=int)
        parser.add_argument("--follow", action="store_true", help="Keep printing new lines")

    def handle(self, *args: Any, **options: Any) -> None:
        launch = Launch.objects.filter(pk=options["id"]).first()
        if launch is None:
            raise CommandError(f"no launch #{options['id']}", returncode=2)
        if launch.group_id is not None:
            raise CommandError(
                f"launch #{launch.pk} is node rank {launch.node_rank} of launch "
                f"#{launch.group_id}, whose one log holds every node's lines: "
                f"launch-log {launch.group_id}",
                returncode=2,
            )
        after = 0
        while True:
            rows = launch.lines.filter(seq__gt=after).values_list("seq", "text", "node")[:5000]
            for seq, text, node in rows:
                # A multi-node launch's lines carry the node that printed them, as the page's.
                self.stdout.write(with_node(text, node))
                after = seq
            sys.stdout.flush()
            if not options["follow"]:
                return
            launch.refresh_from_db()
            if (
                launch.status in LAUNCH_ENDED
                and after >= launch.last_seq
                and (launch.log_complete or not launch.worker_token)
            ):
                return
            if after >= launch.last_seq:
                time.sleep(0.3)
