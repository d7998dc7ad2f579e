"""Stuck GPUs: recover them in escalating steps that each record what ran, what it answered and
the memory before and after.

Steps (``STEPS``): a. SIGTERM the launch's process group; b. SIGKILL it; c. the launch's stray
processes (its marker, or its session, outside the group); d. defunct processes, reaped through
their parents; e. other holders of the chosen GPUs, only those the operator named by PID;
f. re-read GPU and host memory; g. ``nvidia-smi --gpu-reset`` of GPUs still holding memory with
no process; h. quarantine what is still held, and say that only a driver reload or a reboot
will help. Foreign processes nobody named are never signalled."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from nodes import ssh
from nodes.domain import gpu_holders as gh
from nodes.domain.units import format_bytes
from nodes.models import (
    Cleanup,
    CleanupStep,
    Launch,
    Node,
    NodeEvent,
)
from nodes.models.choices import (
    LAUNCH_ENDED,
)
from nodes.queue import QueueUnavailable, enqueue, later
from nodes.remote import client as agent
from nodes.services import notifications, quarantines, teams
from nodes.services.audit import record
from nodes.services.credentials import target_for
from nodes.services.holders import Inspection, inspect
from nodes.services.reservations import release, release_gpus
from nodes.types import Actor

STEPS = {
    "a": "SIGTERM the launch's process group, wait",
    "b": "SIGKILL the launch's process group",
    "c": "Kill the launch's stray processes",
    "d": "Reap defunct processes through their parents",
    "e": "Kill other holders you confirmed by PID",
    "f": "Re-read GPU and host memory",
    "g": "Reset GPUs holding memory with no process (nvidia-smi --gpu-reset)",
    "h": "Quarantine GPUs still holding memory",
}

#: Seconds a SIGKILL is given to take effect; a process still there after it (D state) is
#: reported, not waited on.
KILL_WAIT_S = 5.0


class NodeLost(Exception):
    """The node stopped answering during a cleanup: what it holds now is unknown."""


class CleanupError(ValueError):
    """The cleanup cannot start: bad input (GPU indexes, PIDs) or a launch still running."""


def request(
    node: Node,
    *,
    actor: Actor,
    launch: Launch | None = None,
    gpus: list[int] | None = None,
    foreign_pids: list[int] | None = None,
    foreign_starts: dict[int, int | None] | None = None,
) -> Cleanup:
    """Record a cleanup to run (``run``). The GPUs default to the launch's, else all of the
    node's. ``foreign_starts`` (PID → start time, clock ticks, as the page showed them) binds
    each confirmed PID to the process that was read: a PID reused since is left alone. Raises
    ``CleanupError`` for a node that may not be contacted, GPUs it lacks or a launch that still
    runs."""
    if not node.host_key:
        raise CleanupError(f"{node.name}'s host key is not trusted yet: nothing runs there")
    if not _all_gpus(node):
        raise CleanupError(f"no GPUs are known on {node.name}: run a discovery first")
    indexes = sorted(set(gpus or (launch.gpus if launch else []) or _all_gpus(node)))
    missing = sorted(set(indexes) - set(_all_gpus(node)))
    if missing:
        raise CleanupError(f"{node.name} has no GPU {', '.join(map(str, missing))}")
    if launch is not None and launch.node_id != node.pk:
        raise CleanupError(f"launch #{launch.pk} ran on {launch.node.name}, not {node.name}")
    if launch is not None and launch.status not in LAUNCH_ENDED:
        raise CleanupError(
            f"launch #{launch.pk} is {launch.status}: stop it first (stopping kills its "
            "processes and offers this cleanup if memory stays held)"
        )
    _refuse_hidden(node, actor, foreign_pids or [])
    return Cleanup.objects.create(
        node=node,
        launch=launch,
        gpus=indexes,
        foreign_pids=sorted(set(foreign_pids or [])),
        foreign_starts={str(p): s for p, s in (foreign_starts or {}).items() if s is not None},
        requested_by=actor.get_username() if actor.is_authenticated else "cli",
    )


def _refuse_hidden(node: Node, actor: Actor, pids: list[int]) -> None:
    """Raise ``CleanupError`` when ``pids`` name a process of a launch hidden from ``actor``
    (another team's team-only launch): only its team or an admin may end it. The node is read
    only when such a launch ran there; the worker checks again before signalling anything."""
    hidden = teams.hidden_launches(actor).filter(node=node)
    if not pids or not hidden.exists():
        return
    try:
        found = inspect(node)
    except ssh.RemoteError as exc:
        raise CleanupError(f"{node.name} did not answer: {exc.message}") from None
    ids = set(hidden.values_list("pk", flat=True))
    theirs = sorted(h.pid for h in found.holders if h.launch_id in ids and h.pid in pids)
    if theirs:
        raise CleanupError(
            f"PID {', '.join(map(str, theirs))}: a team-only launch's process; only its team "
            "or an admin may end it"
        )


def _protected(cleanup: Cleanup, holders: list[gh.Holder]) -> set[int]:
    """Launch ids among ``holders`` whose processes are never signalled: those hidden from
    whoever asked for the cleanup (an unknown requester sees no team-only launch), and those
    still running (a running launch is stopped, not cleaned up)."""
    ids = {h.launch_id for h in holders if h.launch_id is not None}
    user = get_user_model().objects.filter(username=cleanup.requested_by).first()
    actor: Actor = user if user is not None else AnonymousUser()
    hidden = set(teams.hidden_launches(actor).filter(pk__in=ids).values_list("pk", flat=True))
    return hidden | running_launches(ids)


def running_launches(ids: Iterable[int | None]) -> set[int]:
    """The launches among ``ids`` that have not ended."""
    wanted = [i for i in ids if i is not None]
    return set(
        Launch.objects.filter(pk__in=wanted)
        .exclude(status__in=LAUNCH_ENDED)
        .values_list("pk", flat=True)
    )


def queue(job: Cleanup) -> None:
    """Hand a recorded cleanup to a worker. When the task queue is away the cleanup ends
    ``error`` saying so (nothing ran) and ``QueueUnavailable`` is raised."""

    def not_started(exc: QueueUnavailable) -> None:
        _end(job, Cleanup.Status.ERROR, f"not started: {exc}", None)
        raise exc

    enqueue("nodes.cleanup_gpus", job.pk, unavailable=not_started)


def _all_gpus(node: Node) -> list[int]:
    return list(node.gpus.values_list("index", flat=True))


class _Run:
    """One cleanup's steps (``STEPS``), each a method answering ``(outcome, command, output)``
    and recorded as it ends, with the memory measured before and after it."""

    def __init__(self, cleanup: Cleanup) -> None:
        self.cleanup = cleanup
        self.node = cleanup.node
        self.launch = cleanup.launch
        self.group = cleanup.launch.pgid if cleanup.launch is not None else None
        self.chosen = list(cleanup.gpus)
        self.number = 0
        self.state = inspect(self.node, launch=self.launch)

    # --- recording ----------------------------------------------------------------------------

    def measure(self, state: Inspection) -> dict[str, Any]:
        return {
            "gpus": {
                str(g.index): {
                    "state": g.state,
                    "used_bytes": g.memory_used_bytes,
                    "orphaned_bytes": g.orphaned_bytes,
                    "holders": [h.pid for h in g.holders],
                }
                for g in state.gpus
                if g.index in self.chosen
            },
            "mem_available_bytes": state.host.get("mem_available_bytes"),
        }

    def step(self, key: str, act: Callable[[], tuple[str, str, str]]) -> None:
        """Run one step: ``act`` returns (outcome, command, output); measure after it. Raises
        ``NodeLost`` when the node stops answering (the step is recorded first)."""
        started = timezone.now()
        before = self.measure(self.state)
        try:
            outcome, command, output = act()
        except ssh.RemoteError as exc:
            outcome, command, output = "failed", "", exc.message
        lost = None
        if outcome not in ("nothing to do", "skipped"):
            try:
                self.state = inspect(self.node, launch=self.launch)
            except ssh.RemoteError as exc:
                lost = exc.message
                output += f"\n(re-reading the node failed: {exc.message})"
                outcome = "failed"
        self.number += 1
        CleanupStep.objects.create(
            cleanup=self.cleanup,
            number=self.number,
            key=key,
            title=STEPS[key],
            outcome=outcome,
            command=command,
            output=output[:20000],
            before=before,
            after=None if lost else self.measure(self.state),
            started=started,
            finished=timezone.now(),
        )
        if lost is not None:
            raise NodeLost(f"{self.node.name} stopped answering after step {key}: {lost}")

    def steps(self) -> tuple[tuple[str, Callable[[], tuple[str, str, str]]], ...]:
        return (
            ("a", self.sigterm),
            ("b", self.sigkill),
            ("c", self.strays),
            ("d", self.defunct),
            ("e", self.foreign),
            ("f", self.reread),
            ("g", self.resets),
            ("h", self.quarantine),
        )

    # --- what the steps need ------------------------------------------------------------------

    def plan(self) -> gh.Targets:
        return gh.targets(
            self.state.holders,
            launch_id=self.launch.pk if self.launch else None,
            group=self.group,
            chosen=self.chosen,
            named_foreign=self.cleanup.foreign_pids,
            protected=_protected(self.cleanup, self.state.holders),
        )

    def group_alive(self) -> bool:
        """The launch's own processes live in its group (a reused group id is someone else's)."""
        launch = self.launch
        return launch is not None and any(
            h.pgid == self.group and h.state not in ("Z", "X") and h.launch_id == launch.pk
            for h in self.state.holders
        )

    def ours(self) -> set[int]:
        """PIDs of the launch's own processes."""
        launch = self.launch
        return {h.pid for h in self.state.holders if launch and h.launch_id == launch.pk}

    def stuck(self) -> list[gh.GpuState]:
        """Chosen GPUs holding memory with no process."""
        return [g for g in self.state.gpus if g.index in self.chosen and _orphaned(g)]

    def signal(self, name: str, wait: float, targets: list[str]) -> tuple[str, str, str]:
        """Signal ``targets`` (``-PGID``, or ``PID@START`` so that a reused PID is spared)."""
        with ssh.pool.session(target_for(self.node)) as conn:
            answer = agent.signal(conn, name, wait, targets)
        command = f"kill -{name} " + " ".join(t.split("@")[0] for t in targets)
        return ("done" if not answer.remaining else "some remain"), command, _said(answer, wait)

    # --- the steps ----------------------------------------------------------------------------

    def sigterm(self) -> tuple[str, str, str]:
        if self.launch is None:
            return "nothing to do", "", "no launch named: only holders are looked at"
        if not self.group or not self.group_alive():
            return "nothing to do", "", "no live process in the launch's process group"
        grace = float(settings.RANKWISE_STOP_GRACE_SECONDS)
        return self.signal("TERM", grace, [f"-{self.group}"])

    def sigkill(self) -> tuple[str, str, str]:
        if self.launch is None:
            return "nothing to do", "", "no launch named"
        if not self.group or not self.group_alive():
            return "nothing to do", "", "the launch's process group is gone"
        return self.signal("KILL", KILL_WAIT_S, [f"-{self.group}"])

    def strays(self) -> tuple[str, str, str]:
        pids = set(self.plan().strays)
        if not pids:
            return "nothing to do", "", "no process of the launch outside its group"
        return self.signal(
            "KILL", KILL_WAIT_S, [h.target for h in self.state.holders if h.pid in pids]
        )

    def defunct(self) -> tuple[str, str, str]:
        pids = self.plan().defunct
        if not pids:
            return "nothing to do", "", "no defunct process"
        with ssh.pool.session(target_for(self.node)) as conn:
            answer = agent.reap(conn, KILL_WAIT_S, pids)
            # A parent that does not collect its children is the launch's own process: end
            # it, and init collects them.
            parents = sorted({p["ppid"] for p in answer.defunct if p["ppid"] in self.ours()})
            if parents:
                agent.signal(conn, "KILL", KILL_WAIT_S, [str(p) for p in parents])
                answer = agent.reap(conn, KILL_WAIT_S, pids)
        lines = [f"SIGCHLD to parents {answer.signalled_parents or 'none'}"]
        if parents:
            lines.append(f"SIGKILL to the launch's parents that did not collect them: {parents}")
        lines += [f"still defunct: PID {p['pid']} (parent {p['ppid']})" for p in answer.defunct]
        command = "kill -CHLD <parent>" + ("; kill -KILL <parent>" if parents else "")
        return ("done" if not answer.defunct else "some remain"), command, "\n".join(lines)

    def foreign(self) -> tuple[str, str, str]:
        targets = self.plan()
        notes = _left_alone(targets, self.state.holders, self.chosen, self.cleanup.foreign_pids)
        if not targets.foreign:
            return "nothing to do", "", "\n".join(notes) or "no other holder"
        starts = {int(p): int(s) for p, s in (self.cleanup.foreign_starts or {}).items()}
        named = [h for h in self.state.holders if h.pid in targets.foreign]
        # A PID the operator confirmed on a page is killed only while it is that process.
        reused = [h for h in named if h.pid in starts and h.start != starts[h.pid]]
        notes += [
            f"PID {h.pid} named, but it is no longer the process the page showed (it started "
            "again since): not touched"
            for h in reused
        ]
        named = [h for h in named if h not in reused]
        if not named:
            return "nothing to do", "", "\n".join(notes)
        outcome, command, output = self.signal("TERM", 10.0, [h.target for h in named])
        # SIGKILL only what a fresh reading still shows as the same process on these GPUs.
        self.state = inspect(self.node, launch=self.launch)
        wanted = {n.target for n in named}
        still = [h for h in self.state.holders if h.target in wanted and h.state not in ("Z", "X")]
        if still:
            _, more, out2 = self.signal("KILL", KILL_WAIT_S, [h.target for h in still])
            command, output = f"{command}; {more}", f"{output}\n{out2}"
        return "done", command, "\n".join([output, *notes])

    def reread(self) -> tuple[str, str, str]:
        lines = [
            f"GPU {g.index}: {g.state}, {format_bytes(g.memory_used_bytes, 'GiB')} used, "
            f"{len(g.holders)} holder(s), {format_bytes(g.orphaned_bytes, 'GiB')} with no process"
            for g in map(self.state.gpu, self.chosen)
            if g is not None
        ]
        lines.append(_host_line(self.state.host))
        return "done", "nvidia-smi/NVML and /proc/meminfo", "\n".join(lines)

    def resets(self) -> tuple[str, str, str]:
        stuck = self.stuck()
        if not stuck:
            return "nothing to do", "", "no GPU holds memory without a process"
        lines, commands, failed = [], [], False
        with ssh.pool.session(target_for(self.node)) as conn:
            for g in stuck:
                answer = agent.reset(conn, g.index)
                commands.append(shlex.join(answer.command))
                lines.append(f"GPU {g.index}: exit {answer.exit_status}: {answer.output}")
                failed = failed or answer.exit_status != 0
        return ("failed" if failed else "done"), "; ".join(commands), "\n".join(lines)

    def quarantine(self) -> tuple[str, str, str]:
        stuck = self.stuck()
        if not stuck:
            return "nothing to do", "", "no chosen GPU holds memory without a process"
        lines = []
        for g in stuck:
            reason = (
                f"{format_bytes(g.orphaned_bytes, 'GiB')} of "
                f"{format_bytes(g.memory_total_bytes, 'GiB')} held with no process after "
                f"cleanup #{self.cleanup.pk}; the GPU reset did not help: the node needs a "
                "driver reload or a reboot"
            )
            quarantines.put(self.node, g.index, reason, self.cleanup)
            lines.append(f"GPU {g.index} quarantined: {reason}")
            notifications.node_event(
                self.node, "gpu.quarantine", f"GPU {g.index}: {reason}", self.launch
            )
        self.state = inspect(self.node, launch=self.launch)
        return "done", "", "\n".join(lines)

    # --- the end ------------------------------------------------------------------------------

    def result(self) -> dict[str, Any]:
        """The chosen GPUs as they ended, and the launch's reservations released for those
        that came back (a quarantined GPU is kept from every launch by its quarantine)."""
        result = self.state.to_json()
        result["gpus"] = [g for g in result["gpus"] if g["index"] in self.chosen]
        if self.launch is not None:
            freed = [g["index"] for g in result["gpus"] if g["state"] in ("free", "quarantined")]
            if any(g["state"] == "held" for g in result["gpus"]):
                release_gpus(self.launch, freed)
            else:
                release(self.launch)
        return result


def _said(answer: agent.Signalled, wait: float) -> str:
    """What a ``signal`` did, for the step's output."""
    lines = [f"sent {answer.signal} to {', '.join(answer.sent)}"] if answer.sent else []
    lines += [f"{e} (already gone)" if "no such process" in e else e for e in answer.errors]
    lines += [
        f"still there after {wait:g} s: PID {p['pid']} state {p['state']} {p['command']}"
        for p in answer.remaining
    ]
    return "\n".join(lines)


def _left_alone(
    targets: gh.Targets, holders: list[gh.Holder], chosen: list[int], named: list[int]
) -> list[str]:
    """Why each other holder was not touched. Anyone who may see the cleanup reads its output:
    a team-only launch's process is not described."""
    ids = {h.launch_id for h in [*targets.untouched, *targets.refused] if h.launch_id is not None}
    secret = set(teams.team_only_launches().filter(pk__in=ids).values_list("pk", flat=True))
    notes = [
        f"PID {h.pid} ("
        + ("a team-only launch's process" if h.launch_id in secret else h.command)
        + ") not named: left alone"
        for h in targets.untouched
    ]
    notes += [
        f"PID {h.pid} (a team-only launch's process) named: not touched, only its team or "
        "an admin may end it"
        if h.launch_id in secret or h.team_only
        else f"PID {h.pid} (launch #{h.launch_id}'s process) named: not touched, the launch "
        "is still running: stop it instead"
        for h in targets.refused
    ]
    holding = {h.pid for h in holders if set(h.gpus) & set(chosen)}
    notes += [
        f"PID {p} named, but it holds none of GPU {','.join(map(str, chosen))}: not touched"
        for p in named
        if p not in holding
    ]
    return notes


def _host_line(host: dict[str, Any]) -> str:
    return (
        f"host: MemAvailable {format_bytes(host.get('mem_available_bytes') or 0, 'GB')}"
        + (
            f", {format_bytes(host['not_returned_bytes'], 'GB')} less than before the launch"
            if host.get("not_returned_bytes")
            else ""
        )
        + f", Mlocked {format_bytes(host.get('mlocked_bytes') or 0, 'GB')}"
    )


def run(cleanup_id: int) -> Cleanup:
    """Carry out a recorded cleanup, step by step; the result holds each GPU's final state.
    Raises nothing for a node that stops answering: the step says so and the cleanup ends
    ``error``."""
    cleanup = Cleanup.objects.select_related("node", "launch").get(pk=cleanup_id)
    try:
        job = _Run(cleanup)
    except ssh.RemoteError as exc:
        return _end(cleanup, Cleanup.Status.ERROR, f"{cleanup.node.name}: {exc.message}", None)
    try:
        for key, act in job.steps():
            job.step(key, act)
    except NodeLost as exc:
        return _end(cleanup, Cleanup.Status.ERROR, f"{exc}; what it holds now is unknown", None)
    except BaseException as exc:
        # A time limit or a crash must not leave the cleanup "running" for ever.
        _end(
            cleanup, Cleanup.Status.ERROR, f"the cleanup stopped: {type(exc).__name__} {exc}", None
        )
        raise
    result = job.result()
    return _end(cleanup, Cleanup.Status.DONE, _verdict(result["gpus"]), result)


def _orphaned(gpu: gh.GpuState) -> bool:
    return gpu.orphaned_bytes > 0 and not gpu.holders


def _verdict(gpus: list[dict[str, Any]]) -> str:
    quarantined = [g for g in gpus if g["state"] == "quarantined"]
    held = [g for g in gpus if g["state"] == "held"]
    if quarantined:
        total = sum(g["orphaned_bytes"] or g["memory_used_bytes"] for g in quarantined)
        return (
            f"GPU {', '.join(str(g['index']) for g in quarantined)} quarantined: "
            f"{format_bytes(total, 'GiB')} held with no process and no GPU reset possible. "
            "Reload the NVIDIA driver or reboot the node, then run discovery."
        )
    stuck = [h for g in held for h in g["holders"] if h["state"] == "D" and h.get("launch_id")]
    if stuck:
        pids = ", ".join(sorted({str(h["pid"]) for h in stuck}))
        return (
            f"GPU {', '.join(str(g['index']) for g in held)} still held: the launch's PIDs "
            f"{pids} are in uninterruptible sleep (D state), where no signal ends them; they "
            "hold their memory until the node is rebooted."
        )
    if held:
        return (
            f"GPU {', '.join(str(g['index']) for g in held)} still held by processes you did "
            "not name (see the holders); confirm them by PID to include them."
        )
    return "Every chosen GPU is free."


def _end(cleanup: Cleanup, status: str, message: str, result: dict[str, Any] | None) -> Cleanup:
    Cleanup.objects.filter(pk=cleanup.pk).update(
        status=status, message=message, result=result, finished=timezone.now()
    )
    cleanup.refresh_from_db()
    NodeEvent.objects.create(node=cleanup.node, kind="cleanup", message=message)
    if cleanup.launch_id is not None and result is not None:
        # The latest snapshot sets the question: what is still wrong after the cleanup.
        later("nodes.diagnose_launch", cleanup.launch_id)
    record(
        "node.cleanup",
        actor=None,
        actor_name=cleanup.requested_by,
        obj=cleanup.node,
        after={
            "cleanup": cleanup.pk,
            "launch": cleanup.launch_id,
            "gpus": cleanup.gpus,
            "foreign_pids": cleanup.foreign_pids,
            "status": status,
            "message": message,
            "steps": [
                {"key": s.key, "outcome": s.outcome, "command": s.command}
                for s in cleanup.steps.all()
            ],
        },
    )
    return cleanup


#: A cleanup still "running" after this long lost its worker (the task's own limit is 31 min).
STALE_AFTER = timedelta(hours=1)


def expire_stale() -> int:
    """End cleanups whose worker died mid-way (``error``); returns how many."""
    stale = Cleanup.objects.filter(
        status=Cleanup.Status.RUNNING, created__lt=timezone.now() - STALE_AFTER
    )
    count = 0
    for job in stale:
        _end(job, Cleanup.Status.ERROR, "the worker running this cleanup went away", None)
        count += 1
    return count
