"""A launch's flags as the node's SGLang version reads them, and their secrets masked where
they are shown."""

from __future__ import annotations

from typing import Any

from nodes.domain import launch_plan as plan
from nodes.domain import node_group
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
    """The flags the launch runs with: its revision's, on the launch's port; a part of a
    multi-node launch with its ``--node-rank`` and ``--dist-init-addr`` once pre-flight chose
    where the nodes meet."""
    base = flags_for(launch.revision, launch.node)
    args = (
        plan.launch_args(launch.revision.args, base, launch.port)
        if base.values
        else list(launch.revision.args)
    )
    if launch.dist_init_addr:
        args = node_group.node_args(args, launch.node_rank, launch.dist_init_addr)
    return args


def ports_of(launch: Launch, flags: ParsedCommand) -> list[int]:
    """The ports the launch needs free on its node: on one node the server's and those SGLang
    derives from it; in a multi-node launch what its node rank binds (node 0 the store too)."""
    if launch.group_id is not None or plan.nodes_needed(flags) > 1:
        return node_group.node_ports(flags, launch.node_rank)
    return plan.ports_needed(flags)


def masked(doc: Any, args: list[str], env: dict[str, str]) -> Any:
    """``doc`` (JSON-ready) with the command's secret values masked wherever they appear, e.g.
    in argparse's "unrecognized arguments: VALUE" after a mistyped ``--api-keys VALUE``."""
    return mask_doc(doc, secret_values(args, env))
