"""Who holds a node's GPUs, read now: NVML's processes and the processes with /dev/nvidia* open,
matched to the launches whose groups they belong to, with host memory not returned."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from nodes import ssh
from nodes.domain import gpu_holders as gh
from nodes.models import (
    Launch,
    Node,
)
from nodes.models.choices import LAUNCH_ACTIVE
from nodes.remote import client as agent
from nodes.services import readings
from nodes.services.credentials import target_for
from nodes.services.quarantines import quarantined


@dataclass
class Inspection:
    """A node's GPUs and host memory as read now; ``holders`` are every process found."""

    gpus: list[gh.GpuState]
    host: dict[str, Any]
    holders: list[gh.Holder]
    groups: dict[int, int]  # process group → launch id, from the node's launch folders
    # Which source answered for the GPUs ("nvml", "nvidia-smi" or None) and why, in words.
    source: str | None = None
    reading: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": [g.to_json() for g in self.gpus],
            "host": self.host,
            "source": self.source,
            "reading": self.reading,
        }

    def gpu(self, index: int) -> gh.GpuState | None:
        return next((g for g in self.gpus if g.index == index), None)


def inspect(node: Node, *, launch: Launch | None = None) -> Inspection:
    """Read the node's GPUs (NVML) and their holders (open device files, launch groups) and
    its host memory; the GPU reading is stored as a heartbeat's is. Changes nothing on the node.
    Raises ``ssh.RemoteError``."""
    facts = readings.probe(node, live=True, timeout=30)
    # One reading: what this one saw is also what the node page's GPU table and the fleet show.
    readings.save_live(node, facts)
    with ssh.pool.session(target_for(node)) as conn:
        raw = agent.holders(conn)
    folders = [f for f in raw.launches if f.pgid and (f.launch_id or "").isdigit()]
    groups = {int(f.pgid or 0): int(f.launch_id or 0) for f in folders if f.leader_alive}
    ended = dict(
        Launch.objects.filter(
            pk__in=[int(f.launch_id or 0) for f in folders if not f.leader_alive]
        ).values_list("pk", "ended")
    )
    ended_groups: dict[int, tuple[int, float | None]] = {}
    for f in folders:
        when = ended.get(int(f.launch_id or 0))
        if not f.leader_alive and when is not None:
            ended_groups[int(f.pgid or 0)] = (int(f.launch_id or 0), when.timestamp())
    gpus = readings.gpus_json(facts)
    found = gh.holders(raw.processes, gpus, groups, ended_groups)
    before = None
    if launch is not None and launch.memory_timeline:
        before = launch.memory_timeline[0].get("host_available_bytes")
    return Inspection(
        gpus=gh.gpu_states(gpus, found, quarantined(node)),
        host=gh.host_state(raw.meminfo, raw.shm_files, before),
        holders=found,
        groups=groups,
        source=facts.gpu_source,
        reading=facts.gpu_reading,
    )


_READING = TypeAdapter(Inspection)


def reading_json(
    node: Node, inspection: Inspection, launch: Launch | None = None
) -> dict[str, Any]:
    """A reading as JSON for the task's result (``{"node": id, "launch": id or None,
    "inspection": …}``), whole: the page that shows it masks it for its viewer."""
    return {
        "node": node.pk,
        "launch": launch.pk if launch is not None else None,
        "inspection": _READING.dump_python(inspection, mode="json"),
    }


def reading_from_json(doc: Any, node: Node, launch: Launch | None = None) -> Inspection | None:
    """The ``Inspection`` a task answered for ``node`` (and ``launch``: its host memory is read
    against that launch's), or None when ``doc`` is not one (another node's or launch's,
    another task's, or an error's). Each GPU's holders are the same objects as the
    reading's own holders, so masking them once masks them everywhere."""
    if not isinstance(doc, dict) or doc.get("node") != node.pk or "inspection" not in doc:
        return None
    if doc.get("launch") != (launch.pk if launch is not None else None):
        return None
    try:
        found = _READING.validate_python(doc["inspection"])
    except ValidationError:
        return None
    by_pid = {h.pid: h for h in found.holders}
    for gpu in found.gpus:
        gpu.holders = [by_pid.get(h.pid, h) for h in gpu.holders]
    return found


def stuck_gpus(inspection: Inspection) -> list[int]:
    """The GPUs a node's cleanup offers ticked: memory held with no process (``orphaned``), or
    processes of a Rankwise launch that has ended. A free GPU, one a running launch holds, one
    only another user's process holds, and a quarantined one are left for the operator to
    tick (a cleanup kills and resets what it is given)."""
    named = {h.launch_id for g in inspection.gpus for h in g.holders if h.launch_id}
    running = set(
        Launch.objects.filter(pk__in=named, status__in=LAUNCH_ACTIVE).values_list("pk", flat=True)
    )
    return [
        g.index
        for g in inspection.gpus
        if g.state != "quarantined"
        and (
            g.orphaned_bytes > 0
            or any(h.launch_id and h.launch_id not in running for h in g.holders)
        )
    ]
