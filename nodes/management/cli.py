"""Shared pieces of the operator CLI: one-line usage errors, and who a command acts as.

A command acts as ``--actor NAME``, else ``$RANKWISE_ACTOR``, else the built-in ``cli`` account.
"""

from __future__ import annotations

import os
import sys
from argparse import ArgumentParser
from typing import Any, NoReturn

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.management.base import BaseCommand, CommandError, CommandParser

from nodes.models.choices import Role
from nodes.services.roles import has_role


class OneLineParser(CommandParser):
    """An argument parser whose usage errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        if getattr(self, "called_from_command_line", True):
            self.exit(2, f"{self.prog}: error: {message}\n")
        raise CommandError(f"Error: {message}")


class OneLineCommand(BaseCommand):
    """A management command whose every usage error, top-level ones included, is one line, and
    that ends quietly when its reader goes away (``… | head``)."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.__class__ = OneLineParser
        return parser

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            return super().execute(*args, **options)
        except BrokenPipeError:
            # Python would complain again when flushing stdout at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None


def add_actor_argument(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--actor",
        default=None,
        help="User to act as (default: $RANKWISE_ACTOR, else the built-in 'cli' admin account).",
    )


def resolve_actor(name: str | None, needs: Role) -> AbstractBaseUser:
    """Return the acting user, or raise ``CommandError`` if unknown, inactive or below ``needs``."""
    if name is not None:
        source, username = "--actor", name
    elif "RANKWISE_ACTOR" in os.environ:
        source, username = "RANKWISE_ACTOR", os.environ["RANKWISE_ACTOR"]
    else:
        source, username = "", settings.RANKWISE_CLI_USER
    if not username.strip():
        # An empty value is a script's unset variable, not a request to act as the cli admin.
        raise CommandError(f"{source} is empty; name the user to act as")
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"no user named {username!r} to act as (see --actor)")
    if not has_role(user, needs):
        raise CommandError(f"user {username!r} lacks the {needs.label.lower()} role for this")
    return user


def read_small(path: str, flag: str) -> str:
    """A small text file named on the command line (a key, a passphrase); 64 KiB at most."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(64 * 1024 + 1)
    except OSError as exc:
        raise CommandError(f"{flag}: cannot read {path}: {exc.strerror}") from None
    if len(text) > 64 * 1024:
        raise CommandError(f"{flag}: {path} is too large to be an SSH key")
    return text
