"""Launching: make a launch (reserve GPUs and port atomically, or block it at once), pre-flight it
on the node, start the server detached and hand it to its follower (through the queue).

Each step is safe to repeat: a restarted worker re-runs a step and finds what the previous
attempt did (the node-side folder, the conditional status transitions)."""

from __future__ import annotations

import logging
import re
import secrets as pysecrets
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from nodes import ssh
from nodes.domain import launch_plan as plan
from nodes.domain import timeline
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
from nodes.services.launch_flags import args_of, flags_for, masked
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


def _save_adhoc(
    args: list[str], env: dict[str, str], node: Node, actor: Actor, model: ModelFacts
) -> ProfileRevision:
    version = node.sglang_version or DEFAULT_VERSION
    report = evaluate(args, node, model, version=version, env=env)
    author = actor.get_username() if actor.is_authenticated else "cli"
    with transaction.atomic():
        profile = LaunchProfile.objects.create(
            name=f"ad-hoc {timezone.now():%Y%m%d-%H%M%S}-{pysecrets.token_hex(3)}",
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
) -> Launch:
    """Reserve GPUs and port and queue the launch; a reservation already held makes it
    ``blocked`` at once (the unique constraint decides between simultaneous launches).

    Raises ``LaunchInputError`` for input no launch can use (unknown override, wrong GPU count,
    node in maintenance or never trusted, multi-node command).
    """
    overrides = _checked_overrides(overrides)
    _check_node(node, timeout_s)
    if refused := env_problems(dict(revision.env or {}), node):  # saved before the policy?
        raise LaunchInputError("; ".join(refused))
    flags = _launchable(revision, node, port)
    chosen = _gpus_for(node, flags, gpus)
    author = actor.get_username() if actor.is_authenticated else "cli"
    with transaction.atomic():
        commitments.lock(node)  # the node's ledger: one launch at a time takes its room
        launch = Launch.objects.create(
            revision=revision,
            node=node,
            gpus=chosen,
            port=plan.server_port(flags),
            overrides=overrides,
            created_by=author,
            startup_timeout_s=timeout_s or settings.RANKWISE_STARTUP_TIMEOUT_SECONDS,
        )
        launch.remote_dir = f"{REMOTE_ROOT}/{launch.pk}-{pysecrets.token_hex(4)}"
        reserved = reserve(launch, chosen, plan.ports_needed(flags))
        taken: list[plan.Check | None] = [reserved, _commit(launch) if reserved.passed else None]
        blocking = next((c for c in taken if c is not None and not c.passed), None)
        launch.checks = [c.to_json() for c in taken if c is not None]
        launch.save(update_fields=["remote_dir", "checks"])
        if blocking is not None:
            detail = blocking.detail if blocking is reserved else f"budget: {blocking.detail}"
            launch_state.transition(
                launch.pk,
                LaunchStatus.BLOCKED,
                actor_name=author,
                reason=f"pre-flight refused: {detail}",
            )
            release(launch)
            launch.refresh_from_db()
        record(
            "launch.create",
            actor=actor,
            obj=launch,
            after={
                **launch.summary(),
                "command": revision.command_line(),
                "overrides": overrides,
                "verdict": revision.verdict,
            },
            request=request,
        )
        if launch.status == LaunchStatus.PENDING:
            enqueue(
                "nodes.start_launch", launch.pk, unavailable=lambda exc: _not_started(launch, exc)
            )
    return launch


def _commit(launch: Launch) -> plan.Check | None:
    """Take the launch's commitment beside the others on its node (its host pools as its
    flags size them; the model is read at pre-flight); a ``budget`` check that fails when its
    host pools do not fit beside them (unless the budget check is overridden)."""
    memory = replace(
        node_memory(launch.node), neighbours=commitments.neighbours(launch.node, launch)
    )
    unread = ModelFacts(None, None, "read at pre-flight")
    report = evaluate(
        args_of(launch), launch.node, unread, env=dict(launch.revision.env or {}), memory=memory
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
    launch_state.transition(
        launch.pk, LaunchStatus.ERROR, frm=[LaunchStatus.PENDING], reason=reason
    )
    release(launch)
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
) -> Launch:
    """A launch of ``revision``, or of a raw ``command`` stored as an ad-hoc revision (its model
    read with ``wait=model_wait``, before anything is stored); nothing is kept when the input
    is refused (``LaunchInputError``)."""
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
        )


def start(launch_id: int) -> None:
    """Pre-flight, then start the server detached; hands over to the follower (queued).

    A failure of the panel itself (not of the node or the server) makes the launch ``error``.
    """
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


def _start(launch_id: int) -> None:
    launch = Launch.objects.select_related("node", "revision__profile").get(pk=launch_id)
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
    if launch_state.transition(
        launch.pk,
        LaunchStatus.STARTING,
        frm=[LaunchStatus.PREFLIGHT],
        pid=adopted.pid,
        pgid=adopted.pgid,
        remote_dir=adopted.dir or launch.remote_dir,
        started=timezone.now(),
        worker_token="",
        worker_beat=None,
    ):
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
            plan.ports_needed(flags),
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
    checks = [plan.Check(**c) for c in launch.checks if c.get("name") == "reservation"]
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
    checks.append(plan.check_quarantine(quarantines.quarantined(node), launch.gpus))
    checks.append(plan.check_gpus_idle(now, launch.gpus))
    # What the GPUs held before (another user's memory, if overridden) is not this launch's.
    before = {str(g.index): g.memory_used_bytes for g in now if g.index in launch.gpus}
    first = timeline.sample(
        0, facts.host_ram_bytes, facts.mem_available_bytes, {int(i): b for i, b in before.items()}
    )
    Launch.objects.filter(pk=launch.pk).update(gpu_used_before=before, memory_timeline=[first])
    launch.gpu_used_before = before
    model_path = str(flags.get("model_path", default="") or "")
    read = found.preflight
    if set(plan.ports_needed(flags)) - set(found.ports):
        with ssh.pool.session(target_for(node)) as conn:
            read = agent.preflight(conn, model_path, plan.ports_needed(flags))
    checks.append(plan.check_ports(plan.ports_needed(flags), read.listening))
    checks.append(plan.check_model(model_path, read.model_found, read.model_detail))
    checks.append(plan.check_shm(read.shm_bytes, len(launch.gpus)))
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
        report = evaluate(args_of(launch), launch.node, model, version, flags.env, memory)
        commitments.take(launch, report)
    return report


def _record_checks(launch: Launch, checks: list[plan.Check], report: BudgetReport) -> bool:
    """Store the checks; block the launch if one fails without an override. True to go on."""
    docs = masked([c.to_json() for c in checks], list(launch.revision.args), launch.revision.env)
    estimate = {
        "verdict": report.verdict,
        "device_kv_tokens_per_rank": report.device_kv_tokens_per_rank,
        "host_pool_bytes_per_rank": report.host_pool_bytes_per_rank,
        "host_pool_bytes_per_node": report.host_pool_bytes_per_node,
        "weights_bytes_per_rank": report.weights_bytes_per_rank,
        "free_before_load_bytes": report.free_before_load_bytes,
        "calibration": report.calibration,
        "warnings": [m.text for m in report.messages if m.level == "warn"],
    }
    Launch.objects.filter(pk=launch.pk).update(checks=docs, estimate=estimate)
    launch.checks = docs
    blocking = {c.name for c in checks if c.blocks}
    record(
        "launch.preflight",
        actor=None,
        actor_name=launch.created_by,
        obj=launch,
        after={"checks": docs, "warnings": estimate["warnings"], "blocked": bool(blocking)},
    )
    for c in checks:
        if c.override:
            record(
                "launch.override",
                actor=None,
                actor_name=launch.created_by,
                obj=launch,
                after={"check": c.name, "reason": c.override, "detail": c.detail},
            )
    if blocking:
        why = "; ".join(f"{c['name']}: {c['detail']}" for c in docs if c["name"] in blocking)
        _block(launch, docs, why)
        return False
    return True


def _block(launch: Launch, checks: list[dict[str, Any]], why: str) -> None:
    """Pre-flight refused the launch: ``blocked`` with its checks, unless it was stopped
    meanwhile (the stop releases what it holds)."""
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


def _start_remote(launch: Launch, conn: Any) -> agent.GroupStatus:
    revision = launch.revision
    env = plan.launch_env(dict(revision.env or {}), launch.gpus)
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
