"""GPU quarantines: GPUs whose memory no cleanup could free are kept from every launch until a
discovery finds them free (after the node's reboot or driver reload)."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from nodes.domain import gpu_holders as gh
from nodes.models import (
    Cleanup,
    GpuQuarantine,
    Node,
    NodeEvent,
)
from nodes.services.audit import record


def quarantined(node: Node) -> dict[int, str]:
    """GPU index → reason, for the node's GPUs in quarantine now."""
    rows = GpuQuarantine.objects.filter(node=node, lifted_at__isnull=True)
    return {q.index: q.reason for q in rows}


def lift_quarantines(node: Node, gpus: list[dict[str, Any]]) -> list[int]:
    """For each GPU a discovery found free (at most ``IDLE_GPU_BYTES`` used, no process), after
    the node's reboot: end its quarantine. Returns the indexes lifted."""
    free = free_gpus(gpus)
    lifted = []
    for q in GpuQuarantine.objects.filter(node=node, lifted_at__isnull=True, index__in=free):
        because = "a discovery found its memory free"
        GpuQuarantine.objects.filter(pk=q.pk).update(
            lifted_at=timezone.now(), lifted_because=because
        )
        NodeEvent.objects.create(
            node=node, kind="quarantine", message=f"GPU {q.index} back from quarantine: {because}"
        )
        record(
            "gpu.quarantine_lifted",
            actor=None,
            actor_name="discovery",
            obj=node,
            before={"gpu": q.index, "reason": q.reason},
            after={"gpu": q.index, "because": because},
        )
        lifted.append(q.index)
    return lifted


def free_gpus(gpus: list[dict[str, Any]]) -> set[int]:
    """The indexes of the GPUs a reading found free: at most ``IDLE_GPU_BYTES`` used and no
    process (``[{"index", "memory_used_bytes", "processes"}]``)."""
    return {
        int(g["index"])
        for g in gpus
        if int(g.get("memory_used_bytes") or 0) <= gh.IDLE_GPU_BYTES and not g.get("processes")
    }


def put(node: Node, index: int, reason: str, cleanup: Cleanup) -> None:
    """Quarantine GPU ``index`` of ``node`` for ``reason`` (found by ``cleanup``); a GPU in
    quarantine already stays as it is."""
    try:
        with transaction.atomic():
            GpuQuarantine.objects.create(node=node, index=index, reason=reason, cleanup=cleanup)
    except IntegrityError:
        pass  # quarantined already
