"""``manage.py profile save NAME --node NODE [--env NAME=VALUE]... [--message TEXT] [--json]
-- COMMAND...`` and ``manage.py profile show NAME[@REV] [--json]``.

``save`` is the profile form's door from a shell (``services.profiles.submit_revision``): the
same input checks, budget on the node and audit (as ``--actor``, an operator). COMMAND is a
launch command as pasted in the form (``python3 -m sglang.launch_server …``, ``sglang serve …``
or bare flags, after ``VAR=value`` settings, which ``--env`` adds to or overrides). A ``warn``
verdict is saved with its warnings printed: giving the command is the acknowledgement.
Exit status: 0 saved, 1 refused by the budget check (``block``), 2 refused input (the reason,
one line, on stderr). With ``--json`` stdout holds one document: the saved revision (``show``'s
keys plus the budget's ``messages``) or the refusal ``{"refused": "input"|"block", "reason",
…}`` (a block adds ``verdict``, ``messages`` and ``suggestion``).

``show`` prints ``{"name", "number", "node", "args", "env", "verdict"}`` for the revision (the
latest without ``@REV``), secret values masked; ``args`` are the words saved after the launcher.
Exit 2 for a profile the actor cannot see.
"""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

from django.core.management.base import CommandError, CommandParser

from nodes.domain.budget import BudgetReport
from nodes.domain.redact import redact_args, redact_env
from nodes.domain.sglang_flags import split_command
from nodes.management.cli import OneLineCommand, OneLineParser, add_actor_argument, resolve_actor
from nodes.models import Node, ProfileRevision
from nodes.models.choices import Role
from nodes.services import model_facts, profiles
from nodes.workflows import launching

MAX_MESSAGE = 500  # as the form's "What changed"


def revision_json(revision: ProfileRevision) -> dict[str, Any]:
    """``{"name", "number", "node", "args", "env", "verdict"}`` with secret values masked."""
    return {
        "name": revision.profile.name,
        "number": revision.number,
        "node": revision.node.name if revision.node else None,
        "args": redact_args(list(revision.args)),
        "env": redact_env(dict(revision.env or {})),
        "verdict": revision.verdict,
    }


def _messages(report: BudgetReport) -> list[dict[str, str]]:
    return [{"level": m.level, "code": m.code, "text": m.text} for m in report.messages]


class Command(OneLineCommand):
    help = "Save a launch profile revision (checked as the form checks it), or show one."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=OneLineParser)
        save = sub.add_parser(
            "save",
            help="Check a launch command on a node and save it.",
            usage="%(prog)s NAME --node NODE [--env NAME=VALUE]... [--message TEXT] [--json] "
            "[--actor USER] -- COMMAND...",
        )
        save.add_argument("name", help="The profile (made if new; else its next revision).")
        save.add_argument("--node", required=True, help="The node to check it on.")
        save.add_argument(
            "--env", action="append", default=[], metavar="NAME=VALUE", help="Repeatable."
        )
        save.add_argument("--message", default="", help="What changed.")
        save.add_argument("--json", action="store_true", help="Print only one JSON document.")
        add_actor_argument(save)
        show = sub.add_parser("show", help="Show a profile revision, secrets masked.")
        show.add_argument("spec", metavar="NAME[@REV]")
        show.add_argument("--json", action="store_true", help="Print one JSON document.")
        add_actor_argument(show)

    def run_from_argv(self, argv: list[str]) -> None:
        # argparse cannot take options between NAME and a command that has its own options
        # (REMAINDER swallows --node): everything after the first -- is the launch command.
        cut = argv.index("--") if "--" in argv else len(argv)
        self.words = argv[cut + 1 :]
        super().run_from_argv(argv[:cut])

    def handle(self, *args: Any, **options: Any) -> None:
        self.as_json = options["json"]
        if options["action"] == "save":
            self.save(options)
        else:
            self.show(options)

    def actor(self, name: str | None, needs: Role) -> Any:
        try:
            return resolve_actor(name, needs)
        except CommandError as exc:
            self.refuse(str(exc))

    def refuse(self, reason: str, code: int = 2, **doc: Any) -> NoReturn:
        """End with ``code``: the reason on stderr, and with --json the refusal on stdout."""
        if self.as_json:
            kind = "input" if code == 2 else "block"
            self.stdout.write(json.dumps({"refused": kind, "reason": reason, **doc}))
        self.stderr.write(reason)
        sys.stdout.flush()
        raise SystemExit(code)

    def save(self, options: dict[str, Any]) -> None:
        actor = self.actor(options["actor"], Role.OPERATOR)
        node = Node.objects.filter(name=options["node"]).first()
        if node is None:
            self.refuse(f"no node named {options['node'][:63]!r}")
        if len(options["message"]) > MAX_MESSAGE:
            self.refuse(f"--message is longer than {MAX_MESSAGE} characters")
        words = list(getattr(self, "words", []))
        if not words:
            self.refuse("give the launch command after --")
        try:
            argv, env = split_command(words)
        except ValueError as exc:
            self.refuse(f"the launch command cannot be used: {exc}")
        for setting in options["env"]:
            key, sep, value = setting.partition("=")
            if not sep:
                self.refuse(f"--env {setting[:40]!r}: expected NAME=VALUE")
            env[key] = value
        try:
            revision, report, model = profiles.submit_revision(
                profile_name=options["name"],
                node=node,
                args=argv,
                env=env,
                message=options["message"],
                actor=actor,
                acknowledged=True,  # the command itself acknowledges a warn verdict
            )
        except profiles.ProfileRefused as refused:
            if refused.kind == "block" and refused.report is not None:
                report = refused.report
                if not self.as_json:
                    self.print_report(report)
                self.refuse(
                    f"not saved: blocked on {node.name}",
                    1,
                    verdict=report.verdict,
                    messages=_messages(report),
                    suggestion=report.suggestion,
                )
            self.refuse(refused.reason)
        messages = _messages(report)
        if (said := model_facts.not_read(model)) is not None:
            messages.insert(0, said)
        if self.as_json:
            doc = {**revision_json(revision), "messages": messages}
            self.stdout.write(json.dumps(doc))
            return
        if said is not None:
            self.stdout.write(f"  [info] {said['text']}")
        self.print_report(report)
        self.stdout.write(f"Saved {revision} ({report.verdict}) on {node.name}")

    def print_report(self, report: BudgetReport) -> None:
        self.stdout.write(f"Verdict: {report.verdict.upper()}")
        for message in report.messages:
            self.stdout.write(f"  [{message.level}] {message.text}")
        if report.suggestion:
            self.stdout.write(
                "  suggested: " + " ".join(f"{k} {v}" for k, v in report.suggestion.items())
            )

    def show(self, options: dict[str, Any]) -> None:
        actor = self.actor(options["actor"], Role.VIEWER)
        try:
            revision = launching.resolve_profile(options["spec"], actor)
        except launching.LaunchInputError as exc:
            self.refuse(str(exc))
        if revision.profile.adhoc:
            self.refuse(f"no profile named {revision.profile.name!r}")
        doc = revision_json(revision)
        if self.as_json:
            self.stdout.write(json.dumps(doc))
            return
        self.stdout.write(f"{revision} on {doc['node'] or 'no node'}: {doc['verdict']}")
        self.stdout.write(revision.command_line())
