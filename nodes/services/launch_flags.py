"""A launch's flags as the node's SGLang version reads them, and their secrets masked where
they are shown."""

from __future__ import annotations

from typing import Any

from nodes.domain import launch_plan as plan
from nodes.domain.redact import mask_doc, secret_values
from nodes.domain.sglang_flags import ParsedCommand, parse_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import Launch, Node, ProfileRevision


def flags_for(revision: ProfileRevision, node: Node, port: int | None = None) -> ParsedCommand:
    """The revision's flags as the node's SGLang version reads them (with ``port`` if the
    launch moved the server to another port)."""
    version_table = table(node.sglang_version or DEFAULT_VERSION)
    flags = parse_command(list(revision.args), version_table)
    if port is not None and flags.values:
        flags = parse_command(plan.launch_args(revision.args, flags, port), version_table)
    flags.env = dict(revision.env or {})
    return flags


def args_of(launch: Launch) -> list[str]:
    """The flags the launch runs with: its revision's, on the launch's port."""
    base = flags_for(launch.revision, launch.node)
    return (
        plan.launch_args(launch.revision.args, base, launch.port)
        if base.values
        else list(launch.revision.args)
    )


def masked(doc: Any, args: list[str], env: dict[str, str]) -> Any:
    """``doc`` (JSON-ready) with the command's secret values masked wherever they appear, e.g.
    in argparse's "unrecognized arguments: VALUE" after a mistyped ``--api-keys VALUE``."""
    return mask_doc(doc, secret_values(args, env))
