"""Launching: make a launch (reserve GPUs and port atomically, or block it at once), pre-flight it
on the node, start the server detached and hand it to its follower (through the queue).

Each step is safe to repeat: a restarted worker re-runs a step and finds what the previous
attempt did (the node-side folder, the conditional status transitions)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import secrets as pysecrets
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from nodes import ssh
from nodes.domain import launch_plan as plan
from nodes.domain import node_group, timeline
from nodes.domain.budget import BudgetReport, NodeMemory
from nodes.domain.probe_parse import NodeFacts
from nodes.domain.redact import redact_args, redact_env
from nodes.domain.sglang_flags import ParsedCommand, parse_command, split_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import Launch, LaunchProfile, Node, ProfileRevision, Reservation
from nodes.models.choices import (
    LaunchStatus,
    NodeStatus,
)
from nodes.queue import QueueUnavailable, enqueue, later
from nodes.remote import client as agent
from nodes.services import (
    commitments,
    hostkeys,
    launch_state,
    quarantines,
    readings,
    teams,
    teardown,
)
from nodes.services import model_facts as model_readings
from nodes.services.audit import record
from nodes.services.credentials import target_for
from nodes.services.launch_flags import args_of, flags_for, masked, ports_of
from nodes.services.model_facts import ModelFacts, model_facts
from nodes.services.profiles import env_problems, evaluate, input_problem, node_memory
from nodes.services.reservations import release, reserve
from nodes.types import Actor

log = logging.getLogger(__name__)


REMOTE_ROOT = "~/.rankwise/launches"


class LaunchInputError(ValueError):
    """The launch cannot be made as asked; the message is for the operator."""


def resolve_profile(spec: str, actor: Actor | None = None) -> ProfileRevision:
    """``NAME`` (latest revision) or ``NAME@REV``, among the profiles ``actor`` may see (all
    when no actor is given); raises ``LaunchInputError``."""
    name, at, number = spec.partition("@")
    if at and not re.fullmatch(r"[0-9]{1,9}", number):
        raise LaunchInputError(f"{spec!r}: the revision after @ must be a number")
    seen = teams.visible_profiles(actor) if actor is not None else LaunchProfile.objects.all()
    profile = seen.filter(name=name).first()
    if profile is None:
        raise LaunchInputError(f"no profile named {name!r}")
    if number:
        revision = profile.revisions.filter(number=int(number)).first()
        if revision is None:
            raise LaunchInputError(f"profile {name!r} has no revision {number}")
        return revision
    latest = profile.latest()
    if latest is None:
        raise LaunchInputError(f"profile {name!r} has no revisions")
    return latest


def adhoc_revision(
    command: str | list[str],
    node: Node,
    actor: Actor,
    *,
    check_flags: bool = True,
    model_wait: float | None = None,
) -> ProfileRevision:
    """Store a raw command line as a one-off profile revision (``adhoc``), with its budget
    (the model read as ``model_facts`` reads it with ``wait=model_wait``).

    Raises ``LaunchInputError`` when the text is not an SGLang launch command, or for anything
    the node's SGLang version or the environment policy refuses, as the profile doors do
    (``profiles.input_problem``: unknown words, a port outside 1–65535…), unless
    ``check_flags`` is off (the operator overrides the ``sglang`` check with a reason).
    """
    args, env = adhoc_input(command, node, check_flags=check_flags)
    return _save_adhoc(args, env, node, actor, _model(node, args, model_wait))


def adhoc_input(
    command: str | list[str], node: Node, *, check_flags: bool = True
) -> tuple[list[str], dict[str, str]]:
    """The flags and environment of a raw command line, checked as ``adhoc_revision`` checks
    them; raises ``LaunchInputError``."""
    try:
        args, env = split_command(command)
    except ValueError as exc:
        raise LaunchInputError(str(exc)) from None
    if not args:
        raise LaunchInputError("the command has no flags: give at least --model-path")
    if not args[0].startswith("-"):
        raise LaunchInputError(
            f"{args[0][:40]!r} is not an SGLang launch command: expected "
            "python3 -m sglang.launch_server --model-path … (or sglang serve …)"
        )
    # The flags as the profile doors check them; the environment is ``create``'s to refuse
    # (never overridable), before anything of this is kept.
    if check_flags and (problem := input_problem(node, args, {})):
        raise LaunchInputError(
            masked(f"{problem} (to launch it anyway, override the sglang check)", args, env)
        )
    return args, env


def _model(node: Node, args: list[str], wait: float | None) -> ModelFacts:
    flags = parse_command(args, table(node.sglang_version))
    return model_facts(node, str(flags.get("model_path", default="") or ""), wait=wait)


def adhoc_name(args: list[str], version: str, now: datetime, tag: str) -> str:
    """An ad-hoc command's profile name, told apart at a glance: its model folder's name and
    TP size, when it was pasted, and a random ``tag`` (``ad-hoc qwen2.5-7b tp2
    20261204-212730-751d6a``); at most 63 characters (the name's column)."""
    flags = parse_command(args, table(version))
    model = str(flags.get("model_path", default="") or "").rstrip("/").rsplit("/", 1)[-1]
    tp = flags.get("tp_size", "tensor_parallel_size", default=None)
    what = " ".join(w for w in (model[:24], f"tp{tp}" if tp else "") if w)
    return " ".join(w for w in ("ad-hoc", what, f"{now:%Y%m%d-%H%M%S}-{tag}") if w)[:63]


def _save_adhoc(
    args: list[str], env: dict[str, str], node: Node, actor: Actor, model: ModelFacts
) -> ProfileRevision:
    version = node.sglang_version or DEFAULT_VERSION
    report = evaluate(args, node, model, version=version, env=env)
    author = actor.get_username() if actor.is_authenticated else "cli"
    with transaction.atomic():
        profile = LaunchProfile.objects.create(
            name=adhoc_name(args, version, timezone.now(), pysecrets.token_hex(3)),
            created_by=author,
            adhoc=True,
        )
        return ProfileRevision.objects.create(
            profile=profile,
            number=1,
            args=args,
            env=env,
            message="ad-hoc command line",
            author=author,
            node=node,
            sglang_version=version,
            verdict=report.verdict,
            report=masked(report.to_json(), args, env),
            geometry_source=model.source[:200],  # the column's width: a long reason is cut
        )


def create(
    *,
    node: Node,
    revision: ProfileRevision,
    actor: Actor,
    gpus: list[int] | None = None,
    overrides: dict[str, str] | None = None,
    timeout_s: int | None = None,
    port: int | None = None,
    request: HttpRequest | None = None,
    nodes: Sequence[Node] = (),
) -> Launch:
    """Reserve GPUs and ports and queue the launch; a reservation already held makes it
    ``blocked`` at once (the unique constraint decides between simultaneous launches).

    ``nodes`` (node 0 first, then the rest in rank order) makes one server over several nodes
    (``--nnodes`` of them): node 0's launch is returned, each other node gets a part
    (``Launch.group``) with its own GPUs, ports and commitment, all taken or none (every node's
    ledger locked, in a fixed order). ``gpus`` then names the same GPUs on every node.

    Raises ``LaunchInputError`` for input no launch can use (unknown override, wrong GPU count,
    node in maintenance or never trusted, a command for another number of nodes).
    """
    group = list(nodes) or [node]
    overrides = _checked_overrides(overrides)
    if len({n.pk for n in group}) != len(group):
        raise LaunchInputError("a node is named twice: name each node of the launch once")
    for each in group:
        _check_node(each, timeout_s)
        if refused := env_problems(dict(revision.env or {}), each):  # saved before the policy?
            raise LaunchInputError("; ".join(refused))
    flags = [_launchable(revision, each, port) for each in group]
    _check_node_count(flags[0], group)
    if len(group) > 1:
        _check_group(group, flags[0])
    chosen = [
        _group_gpus(each, f, gpus, len(group) > 1) for each, f in zip(group, flags, strict=True)
    ]
    author = actor.get_username() if actor.is_authenticated else "cli"
    with transaction.atomic():
        for each in sorted(group, key=lambda n: n.pk):
            commitments.lock(each)  # each node's ledger: one launch at a time takes its room
        launches: list[Launch] = []
        taken: list[plan.Check] = []
        for rank, (each, each_flags) in enumerate(zip(group, flags, strict=True)):
            launch = Launch.objects.create(
                revision=revision,
                node=each,
                gpus=chosen[rank],
                port=plan.server_port(each_flags),
                overrides=overrides,
                created_by=author,
                startup_timeout_s=timeout_s or settings.RANKWISE_STARTUP_TIMEOUT_SECONDS,
                group=launches[0] if rank else None,
                node_rank=rank,
            )
            launch.remote_dir = f"{REMOTE_ROOT}/{launch.pk}-{pysecrets.token_hex(4)}"
            reserved = reserve(launch, chosen[rank], ports_of(launch, each_flags))
            own = [c for c in (reserved, _commit(launch) if reserved.passed else None) if c]
            for check in own:
                check.node = each.name if len(group) > 1 else ""
            launch.checks = [c.to_json() for c in own]
            launch.save(update_fields=["remote_dir", "checks"])
            launches.append(launch)
            taken += own
        first = launches[0]
        if len(launches) > 1:  # the group's record lists every node's checks
            first.checks = [c.to_json() for c in taken]
            first.save(update_fields=["checks"])
        blocking = next((c for c in taken if not c.passed), None)
        if blocking is not None:
            where = f"{blocking.node}: " if blocking.node else ""
            detail = blocking.detail
            if blocking.name != "reservation":
                detail = f"budget: {detail}"
            elif len(group) > 1 and f"port {node_group.dist_port(flags[0])} by" in detail:
                detail += (
                    " (the store's port, --dist-init-addr's: another multi-node launch has node "
                    "0 there; give --dist-init-addr another port)"
                )
            for launch in launches:
                launch_state.transition(
                    launch.pk,
                    LaunchStatus.BLOCKED,
                    actor_name=author,
                    reason=f"pre-flight refused: {where}{detail}",
                )
                release(launch)
            first.refresh_from_db()
        record(
            "launch.create",
            actor=actor,
            obj=first,
            after={
                **first.summary(),
                "command": revision.command_line(),
                "overrides": overrides,
                "verdict": revision.verdict,
            },
            request=request,
        )
        if first.status == LaunchStatus.PENDING:
            enqueue(
                "nodes.start_launch", first.pk, unavailable=lambda exc: _not_started(first, exc)
            )
    return first


def _group_gpus(
    node: Node, flags: ParsedCommand, wanted: list[int] | None, named: bool
) -> list[int]:
    """``_gpus_for`` on one node of a launch, its refusal ``named`` by the node where several
    nodes are launched on."""
    try:
        return _gpus_for(node, flags, wanted)
    except LaunchInputError as exc:
        raise LaunchInputError(f"{node.name}: {exc}" if named else str(exc)) from None


def _check_group(group: list[Node], flags: ParsedCommand) -> None:
    """Nodes that are really several, and node 0's ports apart: raises ``LaunchInputError``."""
    seen: dict[tuple[str, int], str] = {}
    for each in group:
        other = seen.setdefault((each.host.lower(), each.port), each.name)
        if other != each.name:
            raise LaunchInputError(
                f"{other} and {each.name} are the same machine ({each.host}:{each.port}): "
                "each node of the launch must be another machine"
            )
    ports = node_group.node_ports(flags, 0)
    try:
        plan.check_port_numbers(ports)
    except plan.PlanError as exc:
        raise LaunchInputError(str(exc)) from None
    store = node_group.dist_port(flags)
    if store in (plan.server_port(flags), flags.get("nccl_port")):
        raise LaunchInputError(
            f"the store's port {store} (--dist-init-addr) is also the server's --port or "
            "--nccl-port on node 0: give --dist-init-addr another port"
        )


def _check_node_count(flags: ParsedCommand, group: list[Node]) -> None:
    """The command's ``--nnodes`` is the number of nodes named; raises ``LaunchInputError``."""
    wanted = plan.nodes_needed(flags)
    if wanted < 1:
        raise LaunchInputError(f"--nnodes {wanted}: the number of nodes must be at least 1")
    if wanted == len(group):
        return
    if wanted > 1 and len(group) == 1:
        raise LaunchInputError(
            f"--nnodes {wanted} is a multi-node launch: name its {wanted} nodes in rank order, "
            f"node 0 first (the {wanted - 1} other node(s) beside node 0)"
        )
    said = f"says --nnodes {wanted}" if "nnodes" in flags.given else "runs on 1 node (no --nnodes)"
    raise LaunchInputError(
        f"the command {said} but {len(group)} nodes are named: give --nnodes {len(group)} in "
        "the command, or name one node per --nnodes, in rank order"
    )


def _commit(launch: Launch) -> plan.Check | None:
    """Take the launch's commitment beside the others on its node (its host pools as its
    flags size them; the model is read at pre-flight); a ``budget`` check that fails when its
    host pools do not fit beside them (unless the budget check is overridden)."""
    memory = replace(
        node_memory(launch.node), neighbours=commitments.neighbours(launch.node, launch)
    )
    unread = ModelFacts(None, None, "read at pre-flight")
    report = evaluate(
        args_of(launch),
        launch.node,
        unread,
        env=dict(launch.revision.env or {}),
        memory=memory,
        profile=launch.revision.profile.name,
    )
    commitments.take(launch, report)
    full = next((m for m in report.messages if m.code == "host_oom"), None)
    if full is None or not memory.neighbours or "budget" in (launch.overrides or {}):
        return None
    return plan.Check("budget", False, full.text)


def _checked_overrides(overrides: dict[str, str] | None) -> dict[str, str]:
    overrides = {k: v.strip() for k, v in (overrides or {}).items()}
    if unknown := plan.unknown_overrides(overrides):
        raise LaunchInputError(
            f"cannot override {', '.join(unknown)}: the checks are "
            + ", ".join(n for n in plan.CHECK_NAMES if n not in plan.NOT_OVERRIDABLE)
        )
    if any(not reason for reason in overrides.values()):
        raise LaunchInputError("every override needs a reason")
    return overrides


def _check_node(node: Node, timeout_s: int | None) -> None:
    if node.status == NodeStatus.MAINTENANCE:
        raise LaunchInputError(f"{node.name} is in maintenance: no launches")
    if node.status == NodeStatus.HOST_KEY_CHANGED:
        raise LaunchInputError(
            f"{node.name}'s host key changed: no launches until an admin trusts the new key "
            f"({node.status_reason})"
        )
    if not node.host_key:
        raise LaunchInputError(f"{node.name}'s host key is not trusted yet")
    if timeout_s is not None and timeout_s <= 0:
        raise LaunchInputError("the start-up timeout must be a positive number of seconds")


def _launchable(revision: ProfileRevision, node: Node, port: int | None) -> ParsedCommand:
    """The revision's flags on ``port``, as the node's SGLang reads them; raises
    ``LaunchInputError`` when SGLang would refuse them before starting."""
    flags = flags_for(revision, node, port)
    if not flags.values:  # argparse refused the command: SGLang would exit before starting
        problem = "; ".join(i.message for i in flags.issues)
        raise LaunchInputError(
            masked(
                f"SGLang {node.sglang_version or DEFAULT_VERSION} refuses the command: {problem}",
                list(revision.args),
                dict(revision.env or {}),
            )
        )
    if "model_path" not in flags.given:
        raise LaunchInputError("the command has no --model-path (SGLang requires one)")
    return flags


def _gpus_for(node: Node, flags: ParsedCommand, wanted: list[int] | None) -> list[int]:
    """The GPUs the launch takes: ``wanted``, or the first free ones it needs."""
    try:
        ranks = plan.ranks_needed(flags)
        plan.check_port_numbers(plan.ports_needed(flags))
        busy = set(
            Reservation.objects.filter(node=node, kind="gpu").values_list("number", flat=True)
        )
        busy |= {g.index for g in node.gpus.all() if g.processes}
        indexes = list(node.gpus.values_list("index", flat=True))
        if not indexes:
            raise plan.PlanError(f"{node.name} has no GPUs in the inventory: discover it first")
        return plan.choose_gpus(indexes, busy, ranks, wanted)
    except plan.PlanError as exc:
        raise LaunchInputError(str(exc)) from None


def _not_started(launch: Launch, exc: QueueUnavailable) -> None:
    """The task queue did not take the new launch: it ends ``error`` saying so (nothing ran;
    GPUs and port released) and ``QueueUnavailable`` is raised."""
    reason = f"not started: {exc}"
    for each in [launch, *launch.parts.all()]:
        launch_state.transition(
            each.pk, LaunchStatus.ERROR, frm=[LaunchStatus.PENDING], reason=reason
        )
        release(each)
    raise exc


def submit(
    *,
    node: Node,
    actor: Actor,
    revision: ProfileRevision | None = None,
    command: str | list[str] | None = None,
    gpus: list[int] | None = None,
    overrides: dict[str, str] | None = None,
    timeout_s: int | None = None,
    port: int | None = None,
    request: HttpRequest | None = None,
    model_wait: float | None = None,
    nodes: Sequence[Node] = (),
) -> Launch:
    """A launch of ``revision``, or of a raw ``command`` stored as an ad-hoc revision (its model
    read with ``wait=model_wait``, before anything is stored); nothing is kept when the input
    is refused (``LaunchInputError``). ``nodes``: a launch over several nodes (see ``create``),
    ``node`` being the first of them."""
    adhoc = None
    if revision is None:
        if command is None:
            raise LaunchInputError("give a profile revision or a command line")
        flags_checked = "sglang" not in (overrides or {})
        args, env = adhoc_input(command, node, check_flags=flags_checked)
        adhoc = (args, env, _model(node, args, model_wait))
    with transaction.atomic():
        if adhoc is not None:
            revision = _save_adhoc(*adhoc[:2], node, actor, adhoc[2])
        assert revision is not None
        return create(
            node=node,
            revision=revision,
            actor=actor,
            gpus=gpus,
            overrides=overrides,
            timeout_s=timeout_s,
            port=port,
            request=request,
            nodes=nodes,
        )


def start(launch_id: int) -> None:
    """Pre-flight, then start the server detached; hands over to the follower (queued).

    A failure of the panel itself (not of the node or the server) makes the launch ``error``.
    """
    if Launch.objects.filter(pk=launch_id, group__isnull=False).exists():
        return  # a node's part of a multi-node launch: its group's start starts it
    token = pysecrets.token_hex(8)
    if not launch_state.claim(launch_id, token, (LaunchStatus.PENDING, LaunchStatus.PREFLIGHT)):
        return
    moved = launch_state.transition(
        launch_id, LaunchStatus.PREFLIGHT, frm=[LaunchStatus.PENDING, LaunchStatus.PREFLIGHT]
    )
    if moved is None:  # stopped since it was claimed
        launch_state.release_lease(launch_id, token)
        return
    try:
        _start(launch_id)
    except Exception as exc:
        log.exception("launch %s: the panel failed while starting it", launch_id)
        why = f"the panel failed while starting the launch: {type(exc).__name__}: {exc}"
        if launch_state.transition(
            launch_id,
            LaunchStatus.ERROR,
            frm=[LaunchStatus.PREFLIGHT],
            reason=why,
            worker_token="",
            worker_beat=None,
        ):
            release(Launch.objects.get(pk=launch_id))
            for part in Launch.objects.filter(group_id=launch_id):
                if launch_state.transition(
                    part.pk,
                    LaunchStatus.ERROR,
                    frm=[LaunchStatus.PENDING, LaunchStatus.PREFLIGHT],
                    reason=why,
                ):
                    release(part)


def _start(launch_id: int) -> None:
    launch = Launch.objects.select_related("node", "revision__profile").get(pk=launch_id)
    if launch.parts.exists():
        _start_group(launch)
        return
    node = launch.node
    try:
        found = _read_node(launch)
        adopted = found.status
        if adopted.pid is None:
            checks, report = preflight(launch, found)
            if not _record_checks(launch, checks, report):
                return
            with ssh.pool.session(target_for(node)) as conn:
                adopted = _start_remote(launch, conn)
    except ssh.RemoteError as exc:
        failed = plan.Check("reachable", False, f"{node.name}: {exc.message}")
        _block(launch, [*launch.checks, failed.to_json()], failed.detail)
        return
    if _to_starting(launch, adopted, timezone.now()):
        later("nodes.follow_launch", launch.pk)
    else:  # stopped while starting: make sure nothing keeps running
        teardown.stop_remote(launch)


def _read_node(launch: Launch) -> agent.Prepared:
    """Everything pre-flight needs from the node, read in one run of its agent (the host key
    checked first in a fresh handshake, as a full probe does). Raises ``ssh.RemoteError``."""
    node = launch.node
    hostkeys.verify(node)
    flags = parse_command(args_of(launch), table(node.sglang_version or DEFAULT_VERSION))
    path = str(flags.get("model_path", default="") or "")
    local = model_readings.local_folder(path)
    # One pooled connection per node, used one step at a time (sessions do not nest).
    with ssh.pool.session(target_for(node)) as conn:
        return agent.prepare(
            conn,
            launch.remote_dir,
            node.sglang_python,
            path,
            model_readings.stamp_of(node, local) if local else None,
            ports_of(launch, flags),
        )


def preflight(launch: Launch, found: agent.Prepared) -> tuple[list[plan.Check], BudgetReport]:
    """Every check of the launch against the node as ``found`` just read it (one round trip;
    a second only when the node's SGLang turned out to be another version whose flags ask for
    other ports)."""
    node = launch.node
    if found.facts is None or found.preflight is None:
        raise ssh.RemoteError("command_failed", "the node agent's prepare read nothing")
    facts = found.facts
    readings.save_facts(node, facts)
    version = facts.sglang_version or node.sglang_version or DEFAULT_VERSION
    flags = parse_command(args_of(launch), table(version))
    flags.env = dict(launch.revision.env or {})
    checks = [
        plan.Check(**c)
        for c in launch.checks
        if c.get("name") == "reservation" and c.get("node", node.name) == node.name
    ]
    # Again on the worker, just before the start: the node's allowances may have changed.
    checks.append(plan.check_environment(env_problems(flags.env, node)))
    checks.append(plan.check_sglang(facts.sglang_version, _sglang_problem(facts), flags))
    local = model_readings.local_folder(str(flags.get("model_path", default="") or ""))
    if local and found.model is not None:
        model_readings.record(node, local, found.model)  # what _budget's model_facts reads
    report = _budget(launch, flags, facts, version)
    checks.append(plan.check_budget(report))
    now = [
        plan.GpuNow(g.index, g.memory_used_bytes, tuple((p.pid, p.name) for p in g.processes))
        for g in facts.gpus
    ]
    held = quarantines.quarantined(node)
    checks.append(plan.check_quarantine(held, launch.gpus))
    checks.append(plan.check_gpus_idle(now, launch.gpus, quarantined=set(held)))
    # What the GPUs held before (another user's memory, if overridden) is not this launch's.
    before = {str(g.index): g.memory_used_bytes for g in now if g.index in launch.gpus}
    first = timeline.sample(
        0, facts.host_ram_bytes, facts.mem_available_bytes, {int(i): b for i, b in before.items()}
    )
    Launch.objects.filter(pk=launch.pk).update(gpu_used_before=before, memory_timeline=[first])
    launch.gpu_used_before = before
    model_path = str(flags.get("model_path", default="") or "")
    read = found.preflight
    ports = ports_of(launch, flags)
    if set(ports) - set(found.ports):
        with ssh.pool.session(target_for(node)) as conn:
            read = agent.preflight(conn, model_path, ports)
    checks.append(plan.check_ports(ports, read.listening))
    checks.append(plan.check_model(model_path, read.model_found, read.model_detail))
    checks.append(plan.check_shm(read.shm_bytes, len(launch.gpus)))
    if (code := plan.check_code_on_node(args_of(launch), node.server_user)) is not None:
        checks.append(code)
    return plan.apply_overrides(checks, dict(launch.overrides)), report


def _sglang_problem(facts: NodeFacts) -> str | None:
    return next((p for p in facts.problems if "sglang" in p.lower()), None)


def _budget(launch: Launch, flags: ParsedCommand, facts: NodeFacts, version: str) -> BudgetReport:
    """The budget of the launch's own command (its port included) on the node as pre-flight
    just read it, the launch's GPUs only: ``profiles.evaluate`` with that memory."""
    by_index = {g.index: g for g in facts.gpus}
    chosen = [by_index[i] for i in launch.gpus if i in by_index]
    memory = NodeMemory(
        gpu_memory_bytes=tuple(g.memory_total_bytes for g in chosen),
        host_ram_bytes=facts.host_ram_bytes,
        mem_available_bytes=facts.mem_available_bytes,
        cgroup_limit_bytes=facts.cgroup_limit_bytes,
        gpu_used_bytes=tuple(g.memory_used_bytes for g in chosen),
        gpu_names=tuple(g.name for g in chosen),
    )
    model = model_facts(launch.node, str(flags.get("model_path", default="") or ""))
    # Beside the other launches on the node, as committed now; this one's commitment follows
    # what pre-flight just found (the model read, the node's memory).
    with transaction.atomic():
        commitments.lock(launch.node)
        memory = replace(memory, neighbours=commitments.neighbours(launch.node, launch))
        report = evaluate(
            args_of(launch),
            launch.node,
            model,
            version,
            flags.env,
            memory,
            profile=launch.revision.profile.name,
        )
        commitments.take(launch, report)
    return report


def _record_checks(launch: Launch, checks: list[plan.Check], report: BudgetReport) -> bool:
    """Store the checks; block the launch if one fails without an override. True to go on."""
    docs = masked([c.to_json() for c in checks], list(launch.revision.args), launch.revision.env)
    estimate = _estimate(report)
    Launch.objects.filter(pk=launch.pk).update(checks=docs, estimate=estimate)
    launch.checks = docs
    if _audited_blocking(launch, checks, docs, estimate["warnings"]):
        _block(launch, docs, _why_blocked(docs))
        return False
    return True


def _estimate(report: BudgetReport) -> dict[str, Any]:
    """What the launch page and the calibrations keep of the budget pre-flight made."""
    return {
        "verdict": report.verdict,
        "device_kv_tokens_per_rank": report.device_kv_tokens_per_rank,
        "host_pool_bytes_per_rank": report.host_pool_bytes_per_rank,
        "host_pool_bytes_per_node": report.host_pool_bytes_per_node,
        "weights_bytes_per_rank": report.weights_bytes_per_rank,
        "free_before_load_bytes": report.free_before_load_bytes,
        "calibration": report.calibration,
        "warnings": [m.text for m in report.messages if m.level == "warn"],
    }


def _audited_blocking(
    launch: Launch, checks: list[plan.Check], docs: list[dict[str, Any]], warnings: list[str]
) -> bool:
    """Audit the pre-flight and each override; True when a check blocks the launch."""
    blocking = any(c.blocks for c in checks)
    record(
        "launch.preflight",
        actor=None,
        actor_name=launch.created_by,
        obj=launch,
        after={"checks": docs, "warnings": warnings, "blocked": blocking},
    )
    for c in checks:
        if c.override:
            record(
                "launch.override",
                actor=None,
                actor_name=launch.created_by,
                obj=launch,
                after={
                    "check": c.name,
                    "reason": c.override,
                    "detail": c.detail,
                    **({"node": c.node} if c.node else {}),
                },
            )
    return blocking


def _why_blocked(docs: list[dict[str, Any]]) -> str:
    """The blocking checks (as stored: masked) in one line, each with its node if it has one."""
    return "; ".join(
        f"{d['node'] + ' ' if d.get('node') else ''}{d['name']}: {d['detail']}"
        for d in docs
        if not d["passed"] and not d.get("override")
    )


def _block(launch: Launch, checks: list[dict[str, Any]], why: str) -> None:
    """Pre-flight refused the launch: ``blocked`` with its checks, unless it was stopped
    meanwhile (the stop releases what it holds). Blocked and released in one transaction: no
    reader sees a blocked launch still holding its GPUs."""
    with transaction.atomic():
        if launch_state.transition(
            launch.pk,
            LaunchStatus.BLOCKED,
            frm=[LaunchStatus.PENDING, LaunchStatus.PREFLIGHT],
            actor_name=launch.created_by,
            checks=checks,
            reason=f"pre-flight refused: {why}",
            worker_token="",
            worker_beat=None,
        ):
            release(launch)


def _start_remote(launch: Launch, conn: Any, interface: str = "") -> agent.GroupStatus:
    """Start the launch's server on its node; ``interface``: the one a multi-node launch's
    collectives use there, unless the revision's environment names its own."""
    revision = launch.revision
    env = plan.launch_env(dict(revision.env or {}), launch.gpus)
    if interface:
        for variable in node_group.INTERFACE_VARIABLES:
            env.setdefault(variable, interface)
    args = args_of(launch)
    request = {
        "launch_id": launch.pk,
        "args": args,
        "env": env,
        "shown_command": ssh.quote(
            [launch.node.sglang_python, "-m", "sglang.launch_server", *redact_args(args)]
        ),
        "shown_env": redact_env(env),
        "run_as": launch.node.run_as_user,
    }
    return agent.start(conn, launch.remote_dir, launch.node.sglang_python, request)


# --- one server over several nodes ---------------------------------------------------------------

#: How long each other node tries node 0's store port (s), one after the other; node 0 listens
#: until every one of them reached it, or this long for each and a few seconds more.
REACH_TIMEOUT_S = 5.0
REACH_SPARE_S = 3.0


def _start_group(first: Launch) -> None:
    """Pre-flight on every node, then the group's own checks (same SGLang and model everywhere,
    a network they share, node 0's store reachable from each), then start node N − 1 … 1 and
    node 0 last, each handed to its follower. One node refusing blocks them all."""
    parts = list(first.parts.select_related("node", "revision__profile").order_by("node_rank"))
    members = [first, *parts]
    for part in parts:
        launch_state.transition(
            part.pk, LaunchStatus.PREFLIGHT, frm=[LaunchStatus.PENDING, LaunchStatus.PREFLIGHT]
        )
    found: dict[int, agent.Prepared] = {}
    for member in members:
        try:
            found[member.pk] = _read_node(member)
        except ssh.RemoteError as exc:
            _unreachable_member(members, member, exc)
            return
    if all(found[m.pk].status.pid is not None for m in members):
        now = timezone.now()  # a worker restarted after starting every node: adopt them
        statuses = {m.pk: (found[m.pk].status, now) for m in members}
    else:
        for member in members:  # a half-started group (its worker died): start all again
            if found[member.pk].status.pid is not None:
                teardown.stop_remote(member, grace=5)
        meeting = _group_preflight(first, members, found)
        if meeting is None:
            return
        try:
            statuses = _start_members(members, meeting)
        except _MemberFailed as failed:
            _unreachable_member(members, failed.member, failed.error)
            return
    _starting(members, statuses)


class _MemberFailed(Exception):
    def __init__(self, member: Launch, error: ssh.RemoteError) -> None:
        super().__init__(error.message)
        self.member, self.error = member, error


def _group_preflight(
    first: Launch, members: list[Launch], found: dict[int, agent.Prepared]
) -> node_group.Meeting | None:
    """Every node's checks (each named by its node) and the group's; stored on every part and,
    all of them, on node 0's launch. The meeting point, or None when a check blocked them all."""
    own: dict[int, list[plan.Check]] = {}
    reports: dict[int, BudgetReport] = {}
    for member in members:
        checks, reports[member.pk] = preflight(member, found[member.pk])
        for check in checks:
            check.node = member.node.name
        own[member.pk] = checks
    shared, meeting = _group_checks(first, members, found)
    shared = plan.apply_overrides(shared, dict(first.overrides))
    everything = [c for m in members for c in own[m.pk]] + shared
    args, env = list(first.revision.args), dict(first.revision.env or {})
    for part in members[1:]:
        docs = masked([c.to_json() for c in own[part.pk]], args, env)
        Launch.objects.filter(pk=part.pk).update(checks=docs, estimate=_estimate(reports[part.pk]))
    docs = masked([c.to_json() for c in everything], args, env)
    estimate = _estimate(reports[first.pk])
    Launch.objects.filter(pk=first.pk).update(checks=docs, estimate=estimate)
    first.checks = docs
    if _audited_blocking(first, everything, docs, estimate["warnings"]) or meeting is None:
        _block_group(members, docs, _why_blocked(docs) or "the nodes share no network")
        return None
    return meeting


def _group_checks(
    first: Launch, members: list[Launch], found: dict[int, agent.Prepared]
) -> tuple[list[plan.Check], node_group.Meeting | None]:
    """What only the group can show: the same SGLang and model on every node, the network they
    meet on, and node 0's store port reached from every other node (tried from there)."""
    # Pre-flight read each node's facts already (it refuses a prepare that read none).
    facts = {m.pk: found[m.pk].facts or NodeFacts() for m in members}
    versions = [(m.node.name, facts[m.pk].sglang_version) for m in members]
    checks = [node_group.check_versions(versions)]
    flags = flags_for(first.revision, first.node, first.port)
    model_path = str(flags.get("model_path", default="") or "")
    if model_readings.local_folder(model_path):
        configs = [(m.node.name, _config_hash(m)) for m in members]
        checks.append(node_group.check_same_model(model_path, configs))
    nodes = [
        node_group.GroupNode(
            m.node.name,
            tuple(node_group.Interface(name, address) for name, address in facts[m.pk].interfaces),
        )
        for m in members
    ]
    network, meeting = node_group.check_network(flags, nodes, flags.env)
    checks.append(network)
    if meeting is None and first.overrides.get("network"):
        meeting = node_group.fallback_meeting(flags, nodes)
    if meeting is not None:
        checks += _reach_checks(members, meeting)
    return checks, meeting


def _config_hash(launch: Launch) -> str | None:
    """A digest of the model's config.json as pre-flight just stored it for the launch's node."""
    config = model_readings.stored_answer(launch.node, list(launch.revision.args)).get("config")
    if not isinstance(config, dict):
        return None
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def _reach_checks(members: list[Launch], meeting: node_group.Meeting) -> list[plan.Check]:
    """Node 0 listens on the store's port for a moment; every other node tries to reach it
    there, from its own side of the network (what its ranks will do)."""
    first = members[0]
    window = REACH_TIMEOUT_S * (len(members) - 1) + REACH_SPARE_S
    try:
        with ssh.pool.session(target_for(first.node)) as conn:
            opened = agent.listen(conn, meeting.port, window, len(members) - 1)
    except ssh.RemoteError as exc:
        return [plan.Check("dist_init", False, f"{exc.message}", node=first.node.name)]
    if not opened.listening:
        return [
            plan.Check(
                "dist_init",
                False,
                f"port {meeting.port} cannot be opened on {first.node.name}: {opened.error}",
                node=first.node.name,
            )
        ]
    checks = []
    for part in members[1:]:
        try:
            with ssh.pool.session(target_for(part.node)) as conn:
                tried = agent.reach(conn, meeting.host, meeting.port, REACH_TIMEOUT_S)
            reached, error = tried.reached, tried.error
        except ssh.RemoteError as exc:
            reached, error = False, exc.message
        checks.append(node_group.check_reach(part.node.name, meeting.address, reached, error))
    if not all(c.passed for c in checks):
        _until_closed(first, meeting.port, window)
    return checks


def _until_closed(first: Launch, port: int, window: float) -> None:
    """Wait (at most ``window`` s and a little) until node 0's listener left the store's port:
    a launch forced past a failed reach must find the port free for its own store."""
    deadline = time.monotonic() + window + REACH_SPARE_S
    with ssh.pool.session(target_for(first.node)) as conn:
        while time.monotonic() < deadline and port in agent.preflight(conn, "", [port]).listening:
            time.sleep(0.5)


def _start_members(
    members: list[Launch], meeting: node_group.Meeting
) -> dict[int, tuple[agent.GroupStatus, datetime]]:
    """Start every node's ranks, node 0 last (its store waits for the others' ranks), with
    ``--node-rank`` and ``--dist-init-addr``; the interface the nodes meet on for NCCL and Gloo
    unless the environment names one. Raises ``_MemberFailed`` (the started ones stopped)."""
    Launch.objects.filter(pk__in=[m.pk for m in members]).update(dist_init_addr=meeting.address)
    statuses: dict[int, tuple[agent.GroupStatus, datetime]] = {}
    for member in reversed(members):
        member.dist_init_addr = meeting.address
        interface = meeting.interfaces.get(member.node.name, "")
        try:
            with ssh.pool.session(target_for(member.node)) as conn:
                statuses[member.pk] = (_start_remote(member, conn, interface), timezone.now())
        except ssh.RemoteError as exc:
            for started in members:
                if started.pk in statuses:
                    with contextlib.suppress(ssh.RemoteError):
                        teardown.stop_remote(started, grace=5)
            raise _MemberFailed(member, exc) from None
    return statuses


def _to_starting(launch: Launch, status: agent.GroupStatus, started: datetime) -> str | None:
    """``starting``, with the process group the node's agent started (or found running)."""
    return launch_state.transition(
        launch.pk,
        LaunchStatus.STARTING,
        frm=[LaunchStatus.PREFLIGHT],
        pid=status.pid,
        pgid=status.pgid,
        remote_dir=status.dir or launch.remote_dir,
        started=started,
        worker_token="",
        worker_beat=None,
    )


def _starting(
    members: list[Launch], statuses: dict[int, tuple[agent.GroupStatus, datetime]]
) -> None:
    """Every node's part is ``starting`` and followed on its node; a part stopped meanwhile
    stops the lot."""
    moved = [_to_starting(m, *statuses[m.pk]) for m in members]
    if all(moved):
        for member in members:
            later("nodes.follow_launch", member.pk)
        return
    for member, went in zip(members, moved, strict=True):  # stopped while starting
        with contextlib.suppress(ssh.RemoteError):
            teardown.stop_remote(member)
        if went:
            teardown.fail(member.pk, "another node of the launch was stopped while starting")


def _unreachable_member(members: list[Launch], member: Launch, exc: ssh.RemoteError) -> None:
    failed = plan.Check("reachable", False, exc.message, node=member.node.name)
    first = members[0]
    _block_group(members, [*first.checks, failed.to_json()], f"{member.node.name}: {exc.message}")


def _block_group(members: list[Launch], checks: list[dict[str, Any]], why: str) -> None:
    """Pre-flight refused the group: every node's part ``blocked`` (node 0's with every check)."""
    first, parts = members[0], members[1:]
    _block(first, checks, why)
    for part in parts:
        _block(part, list(Launch.objects.get(pk=part.pk).checks or []), why)
