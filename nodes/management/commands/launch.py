"""``manage.py launch --node NAME[,NAME…] [--gpus 0,1] (--profile NAME[@REV] | -- COMMAND...)
[--override CHECK --reason TEXT]... [--wait ready|end] [--timeout S] [--json]``.

The launch goes through the Celery workers, as from the panel; this command always waits for
pre-flight. Exit status: 2 when pre-flight blocks (the JSON lists the checks; a check's ``name``
is what ``--override`` takes) or the input is unusable; without ``--wait``, 0 once pre-flight
passed and the server is starting; ``--wait ready``: 0 once the ready line is stored and health
answered, 1 if the launch fails or ``--timeout`` (its start-up timeout) passes; ``--wait end``:
0 when it was stopped cleanly, 1 when it failed. With ``--json`` stdout holds only
``{"id", "status", "reason", …}``. A multi-node launch (``--nnodes N`` in the command) names
its N nodes, node 0 first (``--node a,b``); its JSON lists ``nodes`` and every check carries
the ``node`` it was made on.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from django.core.management.base import CommandError, CommandParser

from nodes.domain.launch_plan import PlanError, parse_gpu_list
from nodes.management.cli import OneLineCommand, add_actor_argument, resolve_actor
from nodes.models import Launch, Node
from nodes.models.choices import LAUNCH_ENDED, LaunchStatus, Role
from nodes.queue import QueueUnavailable
from nodes.services import inventory
from nodes.workflows import launching

PREFLIGHT_WAIT_S = 600
MAX_TIMEOUT_S = 7 * 24 * 3600
READY = (LaunchStatus.READY,)


def parse_gpus(text: str) -> list[int]:
    try:
        return parse_gpu_list(text)
    except PlanError as exc:
        raise CommandError(f"--gpus {exc}", returncode=2) from None


def nodes_named(text: str) -> list[Node]:
    """``--node a`` or, for a multi-node launch, ``--node a,b`` (node 0 first); raises
    ``CommandError`` for a name with no node."""
    names = [n.strip() for n in text.split(",")]
    if any(not n for n in names):
        raise CommandError(
            f"--node {text!r}: expected NAME or NAME,NAME,… (node 0 first)", returncode=2
        )
    try:
        return inventory.nodes_named(names)
    except inventory.UnknownNode as exc:
        raise CommandError(f"no node named {exc.args[0]!r}", returncode=2) from None


def launch_json(launch: Launch) -> dict[str, Any]:
    doc = launch.summary()
    doc["checks"] = [
        {
            "name": c.get("name"),
            "passed": bool(c.get("passed")),
            "detail": c.get("detail", ""),
            **({"node": c["node"]} if c.get("node") else {}),
        }
        for c in launch.checks or []
    ]
    doc["overrides"] = dict(launch.overrides or {})
    if launch.server_info:
        doc["server_info"] = launch.server_info
    return doc


class Command(OneLineCommand):
    help = "Launch an SGLang server on a node (pre-flight, start, optionally wait)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--node", required=True, help="NAME, or NAME,NAME,… for a multi-node launch"
        )
        parser.add_argument("--gpus", help="GPU indexes, e.g. 0,1 (default: the first free)")
        parser.add_argument("--profile", help="NAME or NAME@REVISION (default: latest)")
        parser.add_argument(
            "--override",
            action="append",
            default=[],
            metavar="CHECK",
            help="Launch despite this failed pre-flight check (needs --reason)",
        )
        parser.add_argument("--reason", action="append", default=[], help="Why, per --override")
        parser.add_argument(
            "--port", type=int, help="Serve on this port instead of the profile's --port"
        )
        parser.add_argument("--wait", choices=["ready", "end"])
        parser.add_argument("--timeout", type=float, help="Start-up timeout in seconds")
        parser.add_argument("--json", action="store_true", help="Print only one JSON document")
        add_actor_argument(parser)
        parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python3 -m sglang…")

    def handle(self, *args: Any, **options: Any) -> None:
        self.as_json = options["json"]
        actor = resolve_actor(options["actor"], Role.OPERATOR)
        group = nodes_named(options["node"])
        node = group[0]
        command = [w for w in options["command"] if w != "--"] if options["command"] else []
        if bool(command) == bool(options["profile"]):
            raise CommandError("give either --profile NAME[@REV] or -- COMMAND", returncode=2)
        if len(options["override"]) != len(options["reason"]):
            raise CommandError("every --override needs its own --reason", returncode=2)
        twice = sorted({c for c in options["override"] if options["override"].count(c) > 1})
        if twice:
            raise CommandError(f"--override {twice[0]} is given twice", returncode=2)
        timeout = options["timeout"]
        if timeout is not None and not (1 <= timeout <= MAX_TIMEOUT_S):
            raise CommandError(
                f"--timeout must be between 1 and {MAX_TIMEOUT_S} seconds", returncode=2
            )
        try:
            revision = (
                launching.resolve_profile(options["profile"], actor) if options["profile"] else None
            )
            launch = launching.submit(
                node=node,
                revision=revision,
                command=command or None,
                actor=actor,
                gpus=parse_gpus(options["gpus"]) if options["gpus"] else None,
                overrides=dict(zip(options["override"], options["reason"], strict=True)),
                timeout_s=math.ceil(timeout) if timeout else None,
                port=options["port"],
                nodes=group if len(group) > 1 else (),
            )
        except launching.LaunchInputError as exc:
            raise CommandError(str(exc), returncode=2) from None
        except QueueUnavailable as exc:
            raise CommandError(f"{exc}; nothing was started") from None
        for part in [launch, *launch.parts.select_related("node").order_by("node_rank")]:
            self.note(
                f"launch #{part.pk}: {launch.revision} on {part.node.name}"
                + (f" (node rank {part.node_rank})" if len(group) > 1 else "")
                + f", GPU {part.gpu_list()}"
            )
        launch = self.wait(
            launch,
            lambda s: s not in (LaunchStatus.PENDING, LaunchStatus.PREFLIGHT),
            PREFLIGHT_WAIT_S,
            "pre-flight",
        )
        self.show_checks(launch)
        if launch.status == LaunchStatus.BLOCKED:
            self.finish(launch, 2)
        if launch.status in (LaunchStatus.PENDING, LaunchStatus.PREFLIGHT):
            launch.reason = "no worker finished pre-flight in time: is the panel running?"
            self.finish(launch, 1)
        wait = options["wait"]
        if wait is None:
            self.finish(launch, 0 if launch.status not in LAUNCH_ENDED else 1)
        if wait == "ready":
            limit = launch.startup_timeout_s + 120
            launch = self.wait(launch, lambda s: s in READY or s in LAUNCH_ENDED, limit, "ready")
            self.finish(launch, 0 if launch.status == LaunchStatus.READY else 1)
        launch = self.wait(launch, lambda s: s in LAUNCH_ENDED, None, "the end")
        self.finish(launch, 0 if launch.status == LaunchStatus.STOPPED else 1)

    def note(self, text: str) -> None:
        if not self.as_json:
            self.stdout.write(text)

    def wait(self, launch: Launch, done: Any, limit: float | None, what: str) -> Launch:
        deadline = None if limit is None else time.monotonic() + limit
        shown = launch.status
        while not done(launch.status):
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.3)
            launch.refresh_from_db()
            if launch.status != shown:
                shown = launch.status
                phase = launch.progress.get("phase", "") if launch.progress else ""
                self.note(f"  {shown}" + (f" ({phase})" if phase else ""))
        return launch

    def show_checks(self, launch: Launch) -> None:
        for check in launch.checks or []:
            mark = (
                "ok" if check.get("passed") else ("overridden" if check.get("override") else "FAIL")
            )
            where = f" ({check['node']})" if check.get("node") else ""
            self.note(f"  [{mark}] {check.get('name')}{where}: {check.get('detail')}")

    def finish(self, launch: Launch, code: int) -> None:
        if launch.status == LaunchStatus.FAILED:
            # A worker diagnoses a moment after the failure (queued); give it that moment.
            for _ in range(120):
                if launch.diagnosis:
                    break
                time.sleep(0.25)
                launch.refresh_from_db()
        if self.as_json:
            self.stdout.write(json.dumps(launch_json(launch)))
        else:
            self.stdout.write(
                f"launch #{launch.pk} {launch.status}"
                + (f": {launch.reason}" if launch.reason else "")
            )
            if isinstance(launch.diagnosis, dict):
                self.stdout.write(f"  diagnosis: {launch.diagnosis.get('category')}: "
                                      f"{launch.diagnosis.get('summary')}")  # fmt: skip
                self.stdout.write(f"  fix: {launch.diagnosis.get('remedy')}")
        sys.stdout.flush()
        raise SystemExit(code)
