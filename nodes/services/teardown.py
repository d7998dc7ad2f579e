"""Ending what runs on a node: stop a launch's process group, read what memory came back and
release the rest, and fail a running launch with a snapshot of the node taken first; the
memory timeline's samples."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from nodes import ssh
from nodes.domain import launch_plan as plan
from nodes.domain import timeline
from nodes.models import Launch
from nodes.models.choices import (
    LAUNCH_RUNNING,
    LaunchStatus,
)
from nodes.queue import QueueUnavailable, enqueue
from nodes.remote import client as agent
from nodes.services import commitments, launch_state, readings
from nodes.services.credentials import target_for
from nodes.services.reservations import release

log = logging.getLogger(__name__)


def stop_remote(launch: Launch, grace: float | None = None) -> agent.StopAnswer:
    """SIGTERM the launch's process group, wait ``grace`` s (``RANKWISE_STOP_GRACE_SECONDS``),
    SIGKILL, wait 10 s; what remains. Raises ``ssh.RemoteError``."""
    grace = settings.RANKWISE_STOP_GRACE_SECONDS if grace is None else grace
    with ssh.pool.session(target_for(launch.node)) as conn:
        return agent.stop(conn, launch.remote_dir, grace, 10)


def held_gpus(launch: Launch) -> dict[int, int]:
    """GPUs of the launch that still hold memory (index → bytes used), read now."""
    facts = readings.probe(launch.node, live=True, timeout=30)
    readings.save_live(launch.node, facts)
    before = launch.gpu_used_before or {}
    return {
        g.index: g.memory_used_bytes
        for g in facts.gpus
        if g.index in launch.gpus
        and g.memory_used_bytes > int(before.get(str(g.index), 0)) + plan.IDLE_GPU_BYTES
    }


def finish(launch: Launch, remaining: list[dict[str, Any]]) -> tuple[dict[int, int], str]:
    """After the group was stopped: release what came back; describe what did not."""
    try:
        held = held_gpus(launch)
    except ssh.RemoteError as exc:
        release(launch, keep_gpus=set(launch.gpus), keep_host=True)
        return {g: 0 for g in launch.gpus}, f"GPU memory not verified ({exc.message})"
    # Processes left (in D state, say) may still pin their host pools: the commitment stays.
    release(launch, keep_gpus=set(held), keep_host=bool(remaining))
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


def fail(
    launch_id: int, reason: str, *, spread: bool = True, frm: Iterable[str] | None = None
) -> bool:
    """Mark a running launch ``failed``: snapshot the node at once, then stop the group and
    release what came back, and queue its diagnosis. False if the launch had already ended or
    is being stopped, or is not in ``frm`` (the statuses the caller's reason holds for; any
    running one but ``stopping`` by default). A node of a multi-node launch failing fails every
    other node's part (``spread``: their ranks would wait on it for ever); the group is
    diagnosed as one."""
    running = [s for s in LAUNCH_RUNNING if s != LaunchStatus.STOPPING]
    if frm is not None:
        running = [s for s in running if s in frm]
    if launch_state.transition(launch_id, LaunchStatus.FAILED, frm=running, reason=reason) is None:
        return False
    launch = Launch.objects.select_related("node").get(pk=launch_id)
    _stop_and_snapshot(launch, reason)
    if spread:
        for other in group_members(launch, exclude=launch):
            fail(other.pk, f"{_named(launch)} failed: {reason}", spread=False)
    if launch.group_id is None:
        # Diagnosed now with the lines stored so far; again by the follower once the log is whole.
        enqueue("nodes.diagnose_launch", launch_id, unavailable=_not_diagnosed(launch_id))
    return True


def group_members(launch: Launch, *, exclude: Launch | None = None) -> list[Launch]:
    """Every launch of ``launch``'s multi-node group (node 0's first, then by node rank), less
    ``exclude``; ``[]`` for a launch on one node."""
    first = launch.group_id or launch.pk
    members = Launch.objects.select_related("node").filter(Q(pk=first) | Q(group_id=first))
    if exclude is not None:
        members = members.exclude(pk=exclude.pk)
    found = sorted(members, key=lambda m: m.node_rank)
    return found if launch.group_id or any(m.group_id for m in found) else []


def _named(launch: Launch) -> str:
    return f"{launch.node.name} (node rank {launch.node_rank})"


def mark_lost(launch: Launch, reason: str) -> bool:
    """A running launch whose node stopped answering becomes ``lost`` (it resumes the status
    it had once the node answers); False when it was not running."""
    return bool(
        launch_state.transition(
            launch.pk,
            LaunchStatus.LOST,
            frm=[LaunchStatus.STARTING, LaunchStatus.LOADING, LaunchStatus.READY],
            resume_status=launch.status,
            lost_since=timezone.now(),
            reason=reason,
        )
    )


def lose_group(lost: Launch, why: str) -> None:
    """A node of a multi-node launch stopped answering: the launch is ``lost`` (node 0's record
    says which node and why) and every other node's ranks are stopped, since they would wait
    on the lost ones for ever. Its own part stays lost until its node answers again."""
    first = (
        lost
        if lost.group_id is None
        else Launch.objects.select_related("node").get(pk=lost.group_id)
    )
    note = f"{_named(lost)} lost: {why}; the other nodes' ranks were stopped"
    if first.pk != lost.pk:
        mark_lost(first, note)
        try:
            finish(first, stop_remote(first, grace=5).remaining)
        except ssh.RemoteError as exc:
            log.warning("launch %s: node 0 not stopped: %s", first.pk, exc.message)
    for part in group_members(lost, exclude=lost):
        if part.pk != first.pk:
            fail(part.pk, f"stopped: {_named(lost)} was lost ({why})", spread=False)


def _stop_and_snapshot(launch: Launch, reason: str) -> None:
    """The failed launch's node as it is now (its snapshot), then its processes stopped and
    what came back released; the snapshot says what could not be done."""
    launch_id = launch.pk
    snap: dict[str, Any] = {}
    try:
        snap = take_snapshot(launch)
        # Who else had host memory committed on the node when it failed (the diagnosis names
        # them: their pools count with this one's).
        snap["neighbours"] = [asdict(n) for n in commitments.neighbours(launch.node, launch)]
        if snap.get("gpus") and snap.get("meminfo"):
            # Sampled as the snapshot was taken, before the stop's grace period.
            used = {g["index"]: g["memory_used_bytes"] for g in snap["gpus"]}
            add_sample(launch, snap["meminfo"], used)
        result = stop_remote(launch, grace=5)
        Launch.objects.filter(pk=launch_id).update(exit_status=result.status.exit_status)
        _, notes = finish(launch, result.remaining)
        if notes:
            Launch.objects.filter(pk=launch_id).update(reason=f"{reason}; {notes}")
    except ssh.RemoteError as exc:
        snap.setdefault("errors", []).append(exc.message)
        release(launch, keep_gpus=set(launch.gpus), keep_host=True)
    Launch.objects.filter(pk=launch_id).update(snapshot=snap)


def _not_diagnosed(launch_id: int) -> Callable[[QueueUnavailable], None]:
    def warn(exc: QueueUnavailable) -> None:
        log.warning(
            "launch %s: diagnosis not queued (%s); its follower queues it again", launch_id, exc
        )

    return warn


def sample_memory(launch: Launch) -> None:
    """Add host RAM and the launch's GPUs' used memory, as a live probe reads them now, to its
    memory timeline. An unreachable node only leaves a gap."""
    try:
        facts = readings.probe(launch.node, live=True, timeout=10)
    except ssh.RemoteError:
        return
    meminfo = {"MemTotal": facts.host_ram_bytes, "MemAvailable": facts.mem_available_bytes}
    add_sample(launch, meminfo, {g.index: g.memory_used_bytes for g in facts.gpus})


def add_sample(launch: Launch, meminfo: dict[str, Any], gpus: dict[int, int]) -> None:
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
    """The node's memory now, as JSON: meminfo, GPUs with their processes, the launch's
    processes and states, kernel OOM lines, listening ports, /dev/shm files. Raises
    ``ssh.RemoteError``."""
    with ssh.pool.session(target_for(launch.node)) as conn:
        snap = agent.snapshot(conn, launch.remote_dir).to_json()
    snap["gpus"] = readings.gpus_json(readings.probe(launch.node, live=True, timeout=30))
    return snap
