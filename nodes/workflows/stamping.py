"""Known-good stamps: a revision that reached ``ready`` on a node and stayed healthy for
``RANKWISE_KNOWN_GOOD_SECONDS`` is stamped there, with the hardware and the footprint the server
really had beside the estimate. Stamps are never removed by later failures elsewhere."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from nodes import ssh
from nodes.models import (
    KnownGoodStamp,
    Launch,
)
from nodes.services import readings
from nodes.services.audit import record
from nodes.services.launch_state import known_good_due


def stamp_if_due(launch: Launch) -> KnownGoodStamp | None:
    """Stamp ``launch``'s revision known-good on its node once it is due; at most once per
    launch. The GPUs' memory is read now (a live probe), less what they held before."""
    if not known_good_due(launch) or KnownGoodStamp.objects.filter(launch=launch).exists():
        return None
    node = launch.node
    gpus = {g.index: g for g in node.gpus.all()}
    chosen = [gpus[i] for i in launch.gpus if i in gpus]
    if not chosen:
        return None
    try:
        facts = readings.probe(node, live=True, timeout=20)
        used = {g.index: g.memory_used_bytes for g in facts.gpus if g.index in launch.gpus}
    except ssh.RemoteError:
        used = {}
    observed = footprint(launch, used)
    healthy = int((timezone.now() - launch.ready_at).total_seconds()) if launch.ready_at else 0
    # The stamp and its audit entry together: nobody reads one without the other.
    try:
        with transaction.atomic():
            stamp = KnownGoodStamp.objects.create(
                revision=launch.revision,
                node=node,
                node_name=node.name,
                launch=launch,
                gpu_name=chosen[0].name,
                gpu_count=len(chosen),
                gpu_memory_bytes=chosen[0].memory_total_bytes,
                host_ram_bytes=node.host_ram_bytes,
                sglang_version=node.sglang_version or launch.revision.sglang_version,
                launched_by=launch.created_by,
                stamped_at=timezone.now(),
                healthy_seconds=healthy,
                observed=observed,
                estimate=launch.estimate,
            )
            record(
                "profile.known_good",
                actor=None,
                actor_name=launch.created_by,
                obj=launch.revision.profile,
                after={
                    "revision": launch.revision.number,
                    "node": node.name,
                    "gpu_class": stamp.gpu_class,
                    "launch": launch.pk,
                    "healthy_seconds": healthy,
                },
            )
    except IntegrityError:
        return None  # another follower stamped it a moment ago
    return stamp


def footprint(launch: Launch, used: dict[int, int]) -> dict[str, Any]:
    """What the server really used: GPU memory per GPU now (``used``, bytes) less what each
    held before the launch, the host pool per rank it logged (bytes), its KV tokens."""
    before = {int(k): int(v) for k, v in (launch.gpu_used_before or {}).items()}
    numbers = (launch.progress or {}).get("numbers") or {}
    info = launch.server_info or {}
    pool_gb = numbers.get("host_pool_gb")
    return {
        "gpu_used_bytes": {str(i): max(b - before.get(i, 0), 0) for i, b in used.items()},
        "host_pool_bytes_per_rank": round(pool_gb * 1e9) if pool_gb else None,
        "max_total_num_tokens": info.get("max_total_num_tokens")
        or numbers.get("max_total_num_tokens"),
    }
