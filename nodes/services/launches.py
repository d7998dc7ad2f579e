"""Launches: reserve atomically, pre-flight on the node, start detached over SSH, stop, fail with
a memory snapshot, and re-adopt launches after the panel's own faults.

Following the log and watching health is ``nodes.services.follower``; this module holds the
steps that change what runs on a node, each safe to repeat: a restarted worker re-runs a step
and finds what the previous attempt did (the node-side folder, the conditional status updates).
"""

from __future__ import annotations

import json
import logging
import re
import secrets as pysecrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone

from nodes import ssh
from nodes.domain import launch_plan as plan
from nodes.domain import timeline
from nodes.domain.budget import BudgetReport, NodeMemory
from nodes.domain.probe_parse import NodeFacts
from nodes.domain.redact import mask_doc, redact_args, redact_env, secret_values
from nodes.domain.sglang_flags import ParsedCommand, parse_command, split_command
from nodes.flag_tables import table
from nodes.models import Launch, LaunchProfile, Node, ProfileRevision, Reservation
from nodes.models.choices import (
    LAUNCH_ACTIVE,
    LAUNCH_ENDED,
    LAUNCH_RUNNING,
    LaunchStatus,
    NodeStatus,
)
from nodes.queue import QueueUnavailable, enqueue
from nodes.services import cleanup, diagnoses, discovery, teams
from nodes.services.audit import record
from nodes.services.credentials import target_for
from nodes.services.profiles import (
    DEFAULT_VERSION,
    env_problems,
    evaluate,
    input_problem,
    model_facts,
)

log = logging.getLogger(__name__)
Actor = AbstractBaseUser | AnonymousUser
LAUNCHCTL = (Path(__file__).resolve().parent.parent / "remote" / "launchctl.py").read_text()
REMOTE_ROOT = "~/.rankwise/launches"


class LaunchInputError(ValueError):
    """The launch cannot be made as asked; the message is for the operator."""


def ctl(client: Any, *args: str, stdin: bytes | None = None, timeout: float = 60) -> dict[str, Any]:
    """Run a ``launchctl`` command on the node; its JSON answer. Raises ``ssh.RemoteError``."""
    return ssh.run_script(
        client, LAUNCHCTL, *args, what="launch control", stdin=stdin, timeout=timeout
    )


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


# --- creating a launch ---------------------------------------------------------------------


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
    command: str | list[str], node: Node, actor: Actor, *, check_flags: bool = True
) -> ProfileRevision:
    """Store a raw command line as a one-off profile revision (``adhoc``), with its budget.

    Raises ``LaunchInputError`` when the text is not an SGLang launch command, or for anything
    the node's SGLang version or the environment policy refuses, as the profile doors do
    (``profiles.input_problem``: unknown words, a port outside 1–65535…), unless
    ``check_flags`` is off (the operator overrides the ``sglang`` check with a reason).
    """
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
    version = node.sglang_version or DEFAULT_VERSION
    flags = parse_command(args, table(version))
    model = model_facts(node, str(flags.get("model_path", default="") or ""))
    flags.env = env
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


def masked(doc: Any, args: list[str], env: dict[str, str]) -> Any:
    """``doc`` (JSON-ready) with the command's secret values masked wherever they appear, e.g.
    in argparse's "unrecognized arguments: VALUE" after a mistyped ``--api-keys VALUE``."""
    return mask_doc(doc, secret_values(args, env))


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
    overrides = {k: v.strip() for k, v in (overrides or {}).items()}
    unknown = plan.unknown_overrides(overrides)
    if unknown:
        raise LaunchInputError(
            f"cannot override {', '.join(unknown)}: the checks are "
            + ", ".join(n for n in plan.CHECK_NAMES if n not in plan.NOT_OVERRIDABLE)
        )
    if any(not reason for reason in overrides.values()):
        raise LaunchInputError("every override needs a reason")
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
    if refused := env_problems(dict(revision.env or {}), node):  # saved before the policy?
        raise LaunchInputError("; ".join(refused))
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
        chosen = plan.choose_gpus(indexes, busy, ranks, gpus)
    except plan.PlanError as exc:
        raise LaunchInputError(str(exc)) from None
    ports = plan.ports_needed(flags)
    author = actor.get_username() if actor.is_authenticated else "cli"
    with transaction.atomic():
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
        reserved = _reserve(launch, chosen, ports)
        launch.checks = [reserved.to_json()]
        if not reserved.passed:
            launch.status = LaunchStatus.BLOCKED
            launch.reason = f"pre-flight refused: {reserved.detail}"
            launch.ended = timezone.now()
        launch.save()
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
            transaction.on_commit(lambda: _queue_start(launch))
    return launch


def _queue_start(launch: Launch) -> None:
    """Hand the new launch to a worker. When the task queue is away it ends ``error`` saying
    so (nothing ran; GPUs and port released) and ``QueueUnavailable`` is raised."""
    try:
        enqueue("nodes.start_launch", launch.pk)
    except QueueUnavailable as exc:
        Launch.objects.filter(pk=launch.pk, status=LaunchStatus.PENDING).update(
            status=LaunchStatus.ERROR, reason=f"not started: {exc}", ended=timezone.now()
        )
        release(launch)
        raise


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
) -> Launch:
    """A launch of ``revision``, or of a raw ``command`` stored as an ad-hoc revision; nothing
    is kept when the input is refused (``LaunchInputError``)."""
    with transaction.atomic():
        if revision is None:
            if command is None:
                raise LaunchInputError("give a profile revision or a command line")
            flags_checked = "sglang" not in (overrides or {})
            revision = adhoc_revision(command, node, actor, check_flags=flags_checked)
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


def _reserve(launch: Launch, gpus: list[int], ports: list[int]) -> plan.Check:
    rows = [Reservation(node=launch.node, kind="gpu", number=g, launch=launch) for g in gpus]
    rows += [Reservation(node=launch.node, kind="port", number=p, launch=launch) for p in ports]
    try:
        with transaction.atomic():
            Reservation.objects.bulk_create(rows)
    except IntegrityError:
        held = Reservation.objects.filter(node=launch.node).filter(
            Q(kind="gpu", number__in=gpus) | Q(kind="port", number__in=ports)
        )
        # Stored on a launch anyone may see: a team-only launch is not named.
        hidden = set(
            held.filter(launch__in=teams.team_only_launches()).values_list("pk", flat=True)
        )
        what = "; ".join(
            f"{'GPU' if r.kind == 'gpu' else 'port'} {r.number} by "
            + ("a team-only launch" if r.pk in hidden else f"launch #{r.launch_id}")
            for r in held
        )
        return plan.Check("reservation", False, f"already held: {what or 'by another launch'}")
    return plan.Check(
        "reservation",
        True,
        f"GPU {', '.join(map(str, gpus))} and port {', '.join(map(str, ports))} reserved",
    )


def _enqueue(task: str, launch_id: int, **options: Any) -> None:
    try:
        enqueue(task, launch_id, **options)
    except QueueUnavailable:  # the reconciler picks the launch up when the broker is back
        log.warning("could not queue %s for launch %s; the reconciler will", task, launch_id)


def release(launch: Launch, *, keep_gpus: set[int] | None = None) -> None:
    """Free the launch's port and every GPU not in ``keep_gpus`` (memory still held)."""
    rows = Reservation.objects.filter(launch=launch)
    if keep_gpus:
        rows = rows.exclude(kind="gpu", number__in=keep_gpus)
    rows.delete()


# --- pre-flight and start ------------------------------------------------------------------


def claim(launch_id: int, token: str, statuses: tuple[str, ...]) -> bool:
    """Take the launch's lease if it is free or stale: the one worker that may act on it."""
    stale = timezone.now() - timedelta(seconds=settings.RANKWISE_FOLLOWER_LEASE_SECONDS)
    return bool(
        Launch.objects.filter(pk=launch_id, status__in=statuses)
        .filter(Q(worker_beat__isnull=True) | Q(worker_beat__lt=stale) | Q(worker_token=token))
        .update(worker_token=token, worker_beat=timezone.now())
    )


def start(launch_id: int) -> None:
    """Pre-flight, then start the server detached; hands over to the follower.

    A failure of the panel itself (not of the node or the server) makes the launch ``error``.
    """
    token = pysecrets.token_hex(8)
    if not claim(launch_id, token, (LaunchStatus.PENDING, LaunchStatus.PREFLIGHT)):
        return
    Launch.objects.filter(pk=launch_id).update(status=LaunchStatus.PREFLIGHT)
    try:
        _start(launch_id)
    except Exception as exc:
        log.exception("launch %s: the panel failed while starting it", launch_id)
        launch = Launch.objects.get(pk=launch_id)
        Launch.objects.filter(pk=launch_id, status=LaunchStatus.PREFLIGHT).update(
            status=LaunchStatus.ERROR,
            reason=f"the panel failed while starting the launch: {type(exc).__name__}: {exc}",
            ended=timezone.now(),
            worker_token="",
            worker_beat=None,
        )
        if Launch.objects.filter(pk=launch_id, status=LaunchStatus.ERROR).exists():
            release(launch)


def _start(launch_id: int) -> None:
    launch = Launch.objects.select_related("node", "revision__profile").get(pk=launch_id)
    node = launch.node
    try:
        # One pooled connection per node, used one step at a time (sessions do not nest).
        with ssh.pool.session(target_for(node)) as client:
            adopted = ctl(client, "status", launch.remote_dir)
        if adopted.get("pid") is None:
            checks, report = preflight(launch)
            if not _record_checks(launch, checks, report):
                return
            with ssh.pool.session(target_for(node)) as client:
                adopted = _start_remote(launch, client)
    except ssh.RemoteError as exc:
        failed = plan.Check("reachable", False, f"{node.name}: {exc.message}")
        _block(launch, [*launch.checks, failed.to_json()], failed.detail)
        return
    updated = Launch.objects.filter(pk=launch.pk, status=LaunchStatus.PREFLIGHT).update(
        status=LaunchStatus.STARTING,
        pid=adopted.get("pid"),
        pgid=adopted.get("pgid"),
        remote_dir=adopted.get("dir", launch.remote_dir),
        started=timezone.now(),
        worker_token="",
        worker_beat=None,
    )
    if updated:
        _enqueue("nodes.follow_launch", launch.pk)
    else:  # stopped while starting: make sure nothing keeps running
        stop_remote(launch)


def preflight(launch: Launch) -> tuple[list[plan.Check], BudgetReport]:
    """Every check of the launch against the node as it is now (a fresh probe)."""
    node = launch.node
    facts = discovery.probe(node)
    discovery.save_facts(node, facts)
    version = facts.sglang_version or node.sglang_version or DEFAULT_VERSION
    flags = parse_command(args_of(launch), table(version))
    flags.env = dict(launch.revision.env or {})
    checks = [plan.Check(**c) for c in launch.checks if c.get("name") == "reservation"]
    # Again on the worker, just before the start: the node's allowances may have changed.
    checks.append(plan.check_environment(env_problems(flags.env, node)))
    checks.append(plan.check_sglang(facts.sglang_version, _sglang_problem(facts), flags))
    report = _budget(launch, flags, facts, version)
    checks.append(plan.check_budget(report))
    now = [
        plan.GpuNow(g.index, g.memory_used_bytes, tuple((p.pid, p.name) for p in g.processes))
        for g in facts.gpus
    ]
    checks.append(plan.check_quarantine(cleanup.quarantined(node), launch.gpus))
    checks.append(plan.check_gpus_idle(now, launch.gpus))
    # What the GPUs held before (another user's memory, if overridden) is not this launch's.
    before = {str(g.index): g.memory_used_bytes for g in now if g.index in launch.gpus}
    first = timeline.sample(
        0, facts.host_ram_bytes, facts.mem_available_bytes, {int(i): b for i, b in before.items()}
    )
    Launch.objects.filter(pk=launch.pk).update(gpu_used_before=before, memory_timeline=[first])
    launch.gpu_used_before = before
    model_path = str(flags.get("model_path", default="") or "")
    with ssh.pool.session(target_for(node)) as client:
        found = ctl(client, "preflight", model_path or "-", *map(str, plan.ports_needed(flags)))
    checks.append(plan.check_ports(plan.ports_needed(flags), found["listening"]))
    checks.append(plan.check_model(model_path, found["model_found"], found["model_detail"]))
    checks.append(plan.check_shm(found["shm_bytes"], len(launch.gpus)))
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
    return evaluate(args_of(launch), launch.node, model, version, flags.env, memory)


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
    Launch.objects.filter(pk=launch.pk).update(
        status=LaunchStatus.BLOCKED,
        checks=checks,
        reason=f"pre-flight refused: {why}",
        ended=timezone.now(),
        worker_token="",
        worker_beat=None,
    )
    release(launch)


def _start_remote(launch: Launch, client: Any) -> dict[str, Any]:
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
    return ctl(
        client,
        "start",
        launch.remote_dir,
        launch.node.sglang_python,
        stdin=json.dumps(request).encode(),
    )


# --- ending a launch -----------------------------------------------------------------------


@dataclass
class StopOutcome:
    """What a stop left behind: processes still alive, GPUs still holding memory (bytes)."""

    launch: Launch
    remaining: list[dict[str, Any]] = field(default_factory=list)
    held_gpus: dict[int, int] = field(default_factory=dict)
    error: str = ""
    # The node did not answer and the stop will be tried again (the launch stays stopping)
    # after ``retry_in`` seconds.
    pending: bool = False
    retry_in: float | None = None

    @property
    def clean(self) -> bool:
        return not self.remaining and not self.held_gpus and not self.error and not self.pending


def stop_remote(launch: Launch, grace: float | None = None) -> dict[str, Any]:
    """SIGTERM the launch's process group, wait, SIGKILL; what remains. Raises RemoteError."""
    grace = settings.RANKWISE_STOP_GRACE_SECONDS if grace is None else grace
    with ssh.pool.session(target_for(launch.node)) as client:
        return ctl(client, "stop", launch.remote_dir, str(grace), "10", timeout=grace + 30)


def _held_gpus(launch: Launch) -> dict[int, int]:
    """GPUs of the launch that still hold memory (index → bytes used), read now."""
    facts = discovery.probe(launch.node, live=True, timeout=30)
    discovery.save_live(launch.node, facts)
    before = launch.gpu_used_before or {}
    return {
        g.index: g.memory_used_bytes
        for g in facts.gpus
        if g.index in launch.gpus
        and g.memory_used_bytes > int(before.get(str(g.index), 0)) + plan.IDLE_GPU_BYTES
    }


def _finish(launch: Launch, remaining: list[dict[str, Any]]) -> tuple[dict[int, int], str]:
    """After the group was stopped: release what came back; describe what did not."""
    try:
        held = _held_gpus(launch)
    except ssh.RemoteError as exc:
        release(launch, keep_gpus=set(launch.gpus))
        return {g: 0 for g in launch.gpus}, f"GPU memory not verified ({exc.message})"
    release(launch, keep_gpus=set(held))
    notes = []
    if remaining:
        notes.append(
            "still running: "
            + ", ".join(f"PID {p['pid']} {p['command'][:60]} ({p['state']})" for p in remaining)
        )
    if held:
        notes.append(
            "GPU memory still held: "
            + ", ".join(f"GPU {i} {v / 2**30:.1f} GiB" for i, v in sorted(held.items()))
            + " (reserved until cleaned up)"
        )
    return held, "; ".join(notes)


def stop(
    launch_id: int,
    *,
    actor: Actor,
    request: HttpRequest | None = None,
    token: str = "",
    retries: bool = False,
) -> StopOutcome:
    """One attempt to stop a launch: processes gone and GPUs' memory back, or what did not
    come back.

    ``token`` names the stop (the stop task's id, the same across its retries); a stop whose
    worker died (its lease, ``stop_beat``, went stale) is taken over, so a second request or
    the reconciler finishes it, continuing its count of attempts (``Launch.stop_attempts``).
    When the node does not answer and ``retries`` is true (the caller tries again) with
    attempts left (``stop_retry_in``), the launch stays ``stopping``, its reason says when the
    next attempt is due (``outcome.pending``, ``outcome.retry_in`` seconds); with no attempt
    left, or an error retrying cannot help, the stop is reported failed and the launch gets
    back the status it had.
    """
    launch = Launch.objects.select_related("node", "revision__profile").get(pk=launch_id)
    if launch.status in LAUNCH_ENDED:
        # Nothing to stop; what it still holds is what cleanup must free.
        return StopOutcome(launch, held_gpus=_still_reserved(launch))
    token = token or pysecrets.token_hex(8)
    who = actor.get_username() if actor.is_authenticated else "cli"
    stoppable = [s for s in LAUNCH_ACTIVE if s != LaunchStatus.STOPPING]
    if Launch.objects.filter(pk=launch.pk, status__in=stoppable).update(
        status=LaunchStatus.STOPPING,
        resume_status=launch.status,
        reason=f"stopping (asked by {who})",
        stop_by=who,
        stop_attempts=0,
        stop_token=token,
        stop_beat=timezone.now(),
    ):
        record("launch.stop", actor=actor, obj=launch, before=launch.summary(), request=request)
    elif not _take_over_stop(launch.pk, token):
        return _await_other_stop(launch, token, retries)
    launch.refresh_from_db()
    return _attempt_stop(launch, token, retries)


def _take_over_stop(launch_id: int, token: str) -> bool:
    """Own the stop of a ``stopping`` launch: ours already (a retry), or left by a stop whose
    worker died (no check-in within the lease, or never one)."""
    stale = timezone.now() - timedelta(seconds=settings.RANKWISE_FOLLOWER_LEASE_SECONDS)
    return bool(
        Launch.objects.filter(pk=launch_id, status=LaunchStatus.STOPPING)
        .filter(Q(stop_token=token) | Q(stop_beat__isnull=True) | Q(stop_beat__lt=stale))
        .update(stop_token=token, stop_beat=timezone.now())
    )


def _attempt_stop(launch: Launch, token: str, retries: bool) -> StopOutcome:
    attempt = launch.stop_attempts + 1
    Launch.objects.filter(pk=launch.pk).update(stop_attempts=attempt)
    with _stop_lease(launch.pk, token):
        try:
            result = stop_remote(launch)
        except ssh.RemoteError as exc:
            return _stop_not_done(launch, exc, attempt, retries)
        remaining = result.get("remaining", [])
        held, notes = _finish(launch, remaining)
    Launch.objects.filter(pk=launch.pk).update(
        status=LaunchStatus.STOPPED,
        reason=f"stopped by {launch.stop_by or 'the panel'}" + (f"; {notes}" if notes else ""),
        ended=timezone.now(),
        exit_status=result.get("exit_status"),
        stop_token="",
        stop_beat=None,
    )
    launch.refresh_from_db()
    return StopOutcome(launch, remaining=remaining, held_gpus=held)


def _stop_not_done(
    launch: Launch, exc: ssh.RemoteError, attempt: int, retries: bool
) -> StopOutcome:
    """The node did not take attempt ``attempt`` (1-based, counted across re-queues) of the
    stop: pending while attempts are left and may help, else failed (reported, audited, the
    launch back to the status it had)."""
    node = launch.node.name
    away = exc.kind in ("unreachable", "timeout")
    retry_in = stop_retry_in(attempt) if retries else None
    if retry_in is not None and away:
        pending = (
            f"stop pending: {node} unreachable ({exc.message}); retrying "
            f"(attempt {attempt + 1}) in {retry_in:g} s"
        )
        # Due again after the wait: the lease covers it, so only a lost retry goes stale.
        due = timezone.now() + timedelta(seconds=retry_in)
        Launch.objects.filter(pk=launch.pk, stop_token=launch.stop_token).update(
            reason=pending, stop_beat=due
        )
        launch.refresh_from_db()
        return StopOutcome(launch, error=pending, pending=True, retry_in=retry_in)
    why = f"{node} did not answer ({exc.message})" if away else exc.message
    failed = (
        f"stop failed after {attempt} attempt{'s' if attempt > 1 else ''}: {why}; "
        "the server may still be running"
    )
    Launch.objects.filter(pk=launch.pk, status=LaunchStatus.STOPPING).update(
        status=launch.resume_status or LaunchStatus.READY,
        reason=failed,
        stop_token="",
        stop_beat=None,
    )
    record(
        "launch.stop_failed",
        actor=None,
        actor_name=launch.stop_by or "panel",
        obj=launch,
        after={"attempts": attempt, "error": exc.message},
    )
    launch.refresh_from_db()
    teams.launch_event(launch, "launch.stop_failed", failed)
    return StopOutcome(launch, error=failed)


@contextmanager
def _stop_lease(launch_id: int, token: str) -> Iterator[None]:
    """Keep the stop's lease fresh while it waits on the node (the grace period, the probe),
    so that only a stop whose worker died goes stale."""
    done = threading.Event()

    def renew() -> None:
        try:
            while not done.wait(settings.RANKWISE_FOLLOWER_LEASE_SECONDS / 3):
                Launch.objects.filter(pk=launch_id, stop_token=token).update(
                    stop_beat=timezone.now()
                )
        finally:
            connection.close()  # this thread's own connection

    thread = threading.Thread(target=renew, name=f"stop-lease-{launch_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def stuck_stops() -> list[Launch]:
    """``stopping`` launches whose stop nobody works on: its lease went stale (its worker
    died, or its retry was lost) or it never had one."""
    stale = timezone.now() - timedelta(seconds=settings.RANKWISE_FOLLOWER_LEASE_SECONDS)
    return list(
        Launch.objects.filter(status=LaunchStatus.STOPPING).filter(
            Q(stop_beat__isnull=True) | Q(stop_beat__lt=stale)
        )
    )


def stop_retry_in(attempts: int) -> float | None:
    """Seconds before the stop's next attempt after ``attempts`` (≥ 1) failed ones (doubling
    from ``RANKWISE_STOP_RETRY_SECONDS``, at most two minutes); ``None`` when the chain is
    spent: at most ``RANKWISE_STOP_RETRIES`` retries after the first attempt, however often the
    stop is queued again."""
    if attempts > settings.RANKWISE_STOP_RETRIES:
        return None
    return float(min(settings.RANKWISE_STOP_RETRY_SECONDS * 2 ** max(attempts - 1, 0), 120))


def stop_retry_lost(launch_id: int, token: str, why: str) -> None:
    """The stop's next attempt could not be queued (``why``): say so, and leave the stop to
    the reconciler (its lease is dropped, so the next pass queues it again, counting on)."""
    Launch.objects.filter(pk=launch_id, status=LaunchStatus.STOPPING, stop_token=token).update(
        reason=f"stop pending: the next attempt could not be queued ({why[:200]}); it is "
        "queued again when the task queue answers",
        stop_beat=None,
    )


def _still_reserved(launch: Launch) -> dict[int, int]:
    """GPUs an ended launch still holds (kept because their memory did not come back); the
    bytes are not re-read here, so they show as 0."""
    return {r.number: 0 for r in launch.reservations.filter(kind="gpu")}


def _await_other_stop(launch: Launch, token: str, retries: bool) -> StopOutcome:
    """Someone else is stopping this launch: report what their stop leaves, or finish it
    when it goes stale (its worker died)."""
    deadline = time.monotonic() + settings.RANKWISE_STOP_GRACE_SECONDS + 60
    while time.monotonic() < deadline:
        launch.refresh_from_db()
        if launch.status in LAUNCH_ENDED:
            return StopOutcome(launch, held_gpus=_still_reserved(launch))
        if launch.status != LaunchStatus.STOPPING:  # that stop failed; its reason says why
            return StopOutcome(launch, error=launch.reason)
        if _take_over_stop(launch.pk, token):
            launch.refresh_from_db()
            return _attempt_stop(launch, token, retries)
        if launch.reason.startswith("stop pending"):  # its own task tries again
            return StopOutcome(launch, error=launch.reason)
        time.sleep(0.5)
    return StopOutcome(launch, error="another stop of this launch has not finished")


def fail(launch_id: int, reason: str) -> bool:
    """Mark a running launch ``failed``: snapshot the node at once, then stop the group and
    release what came back. False if the launch had already ended or is being stopped."""
    running = [s for s in LAUNCH_RUNNING if s != LaunchStatus.STOPPING]
    if not Launch.objects.filter(pk=launch_id, status__in=running).update(
        status=LaunchStatus.FAILED, reason=reason, ended=timezone.now()
    ):
        return False
    launch = Launch.objects.select_related("node").get(pk=launch_id)
    snap: dict[str, Any] = {}
    try:
        snap = take_snapshot(launch)
        if snap.get("gpus") and snap.get("meminfo"):
            # Sampled as the snapshot was taken, before the stop's grace period.
            used = {g["index"]: g["memory_used_bytes"] for g in snap["gpus"]}
            _add_sample(launch, snap["meminfo"], used)
        result = stop_remote(launch, grace=5)
        Launch.objects.filter(pk=launch_id).update(exit_status=result.get("exit_status"))
        _, notes = _finish(launch, result.get("remaining", []))
        if notes:
            Launch.objects.filter(pk=launch_id).update(reason=f"{reason}; {notes}")
    except ssh.RemoteError as exc:
        snap.setdefault("errors", []).append(exc.message)
        release(launch, keep_gpus=set(launch.gpus))
    Launch.objects.filter(pk=launch_id).update(snapshot=snap)
    # Diagnosed now with the lines stored so far; again by the follower once the log is whole.
    diagnoses.diagnose_launch(launch_id)
    return True


def sample_memory(launch: Launch) -> None:
    """Add host RAM and the launch's GPUs' used memory, as a live probe reads them now, to its
    memory timeline. An unreachable node only leaves a gap."""
    try:
        facts = discovery.probe(launch.node, live=True, timeout=10)
    except ssh.RemoteError:
        return
    meminfo = {"MemTotal": facts.host_ram_bytes, "MemAvailable": facts.mem_available_bytes}
    _add_sample(launch, meminfo, {g.index: g.memory_used_bytes for g in facts.gpus})


def _add_sample(launch: Launch, meminfo: dict[str, Any], gpus: dict[int, int]) -> None:
    begun = launch.started or launch.created
    point = timeline.sample(
        (timezone.now() - begun).total_seconds(),
        meminfo.get("MemTotal"),
        meminfo.get("MemAvailable"),
        {i: b for i, b in gpus.items() if i in launch.gpus},
    )
    with transaction.atomic():
        row = Launch.objects.select_for_update().only("memory_timeline").get(pk=launch.pk)
        Launch.objects.filter(pk=launch.pk).update(
            memory_timeline=timeline.append(row.memory_timeline or [], point)
        )


def take_snapshot(launch: Launch) -> dict[str, Any]:
    """The node's memory now: meminfo, GPUs with their processes, the launch's processes and
    states, kernel OOM lines, listening ports, /dev/shm files. Raises ``ssh.RemoteError``."""
    with ssh.pool.session(target_for(launch.node)) as client:
        snap = ctl(client, "snapshot", launch.remote_dir)
    facts = discovery.probe(launch.node, live=True, timeout=30)
    snap["gpus"] = [
        {
            "index": g.index,
            "memory_total_bytes": g.memory_total_bytes,
            "memory_used_bytes": g.memory_used_bytes,
            "processes": [
                {"pid": p.pid, "name": p.name, "used_memory_bytes": p.used_memory_bytes}
                for p in g.processes
            ],
        }
        for g in facts.gpus
    ]
    return snap


# --- re-adoption -----------------------------------------------------------------------------


def orphans() -> list[Launch]:
    """Launches nobody is working on: active, or ended with log lines still on the node, whose
    worker has not checked in within the lease."""
    stale = timezone.now() - timedelta(seconds=settings.RANKWISE_FOLLOWER_LEASE_SECONDS)
    recent = timezone.now() - timedelta(days=1)
    unfinished = Q(status__in=LAUNCH_ACTIVE) | Q(
        status__in=LAUNCH_ENDED, started__isnull=False, log_complete=False, ended__gt=recent
    )
    return list(
        Launch.objects.filter(unfinished).filter(
            Q(worker_beat__isnull=True) | Q(worker_beat__lt=stale)
        )
    )


def reconcile() -> int:
    """Queue the right task for every orphaned launch, and the stop again for every stuck
    stop (its worker died: the stop re-checks the node and finishes); returns how many."""
    found = orphans()
    for launch in found:
        if launch.status in (LaunchStatus.PENDING, LaunchStatus.PREFLIGHT):
            _enqueue("nodes.start_launch", launch.pk)
        else:
            _enqueue("nodes.follow_launch", launch.pk)
    stuck = stuck_stops()
    for launch in stuck:
        if launch.reason.startswith("stop pending"):
            # Its next attempt went with its worker (or was never queued): say what is true.
            Launch.objects.filter(pk=launch.pk, reason=launch.reason).update(
                reason=f"stop pending: {launch.node.name} unreachable at attempt "
                f"{launch.stop_attempts}; the next attempt was lost with its worker and is "
                f"queued again (attempt {launch.stop_attempts + 1})"
            )
        _enqueue("nodes.stop_launch", launch.pk)
    return len(found) + len(stuck)
