"""The fleet at a glance: every node's GPUs and host RAM split by owner (ours, foreign, ghost;
committed, used, free), from what the last reading of each node stored (heartbeat, discovery)
and the node's ledger. Reads only the database: the fleet page never waits on a node."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Prefetch

from nodes.domain.ownership import GpuOwners, HostShare, gpu_owners, host_share
from nodes.domain.units import format_bytes
from nodes.models import Commitment, Gpu, Node, Reservation
from nodes.services import commitments, teams
from nodes.types import Actor


@dataclass(frozen=True)
class GpuView:
    """One GPU as the fleet page shows it: its owners, the launch that reserved it (as the
    viewer may name it), what that launch committed there (bytes, None if not estimated)."""

    owners: GpuOwners
    reserved: str | None = None
    committed_bytes: int | None = None
    quarantined: bool = False
    labels: dict[int, str] = field(default_factory=dict)

    @property
    def waiting_bytes(self) -> int:
        """Committed and not taken yet: the launch will use it once loaded."""
        if self.committed_bytes is None or self.owners.reserved_by is None:
            return 0
        taken = self.owners.ours.get(self.owners.reserved_by, 0)
        return max(0, min(self.committed_bytes - taken, self.owners.free_bytes))


@dataclass(frozen=True)
class NodeView:
    """A node's GPUs and host RAM as the fleet page shows them; ``launches``: each commitment
    said, "#12 (llama@3) — ready, 420 GB host RAM"."""

    node: Node
    gpus: list[GpuView]
    host: HostShare | None
    launches: list[str]


def fleet(user: Actor) -> list[NodeView]:
    """Every node, as ``user`` may see it (another team's team-only launch is not named)."""
    hidden = set(teams.hidden_launches(user).values_list("pk", flat=True))
    nodes = Node.objects.prefetch_related(
        Prefetch("gpus", queryset=Gpu.objects.order_by("index")),
        Prefetch("reservations", queryset=Reservation.objects.filter(kind="gpu")),
        Prefetch(
            "commitments",
            queryset=Commitment.objects.filter(released__isnull=True).select_related(
                "launch__revision__profile"
            ),
            to_attr="active_commitments",
        ),
    )
    return [_node_view(node, hidden) for node in nodes]


def node_view(node: Node, user: Actor) -> NodeView:
    """One node's view, for its own page."""
    hidden = set(teams.hidden_launches(user).values_list("pk", flat=True))
    node.active_commitments = list(commitments.active(node))  # type: ignore[attr-defined]
    return _node_view(node, hidden)


def _node_view(node: Node, hidden: set[int]) -> NodeView:
    held: list[Commitment] = getattr(node, "active_commitments", [])
    by_launch = {c.launch_id: c for c in held}
    labels = {
        c.launch_id: "a team-only launch" if c.launch_id in hidden else _label(c) for c in held
    }
    reserved = {r.number: r.launch_id for r in node.reservations.all() if r.kind == "gpu"}
    quarantined = set(
        node.quarantines.filter(lifted_at__isnull=True).values_list("index", flat=True)
    )
    gpus = []
    for g in node.gpus.all():
        launch = reserved.get(g.index)
        owners = gpu_owners(
            g.index, g.memory_total_bytes, g.memory_used_bytes or 0, g.processes or [], launch
        )
        commitment = by_launch.get(launch) if launch is not None else None
        committed = (commitment.device_bytes or {}).get(str(g.index)) if commitment else None
        names = {i: labels.get(i) or _hidden_or_id(i, hidden) for i in owners.ours}
        shown = (labels.get(launch) or _hidden_or_id(launch, hidden)) if launch else None
        gpus.append(GpuView(owners, shown, committed, g.index in quarantined, names))
    host = host_share(
        node.host_ram_bytes, node.mem_available_bytes, [(c.host_bytes, c.pinned) for c in held]
    )
    said = [
        f"{labels[c.launch_id]} — {c.launch.get_status_display().lower()}, "
        f"{format_bytes(c.host_bytes, 'GB')} host RAM{'' if c.pinned else ' (not pinned yet)'}"
        for c in held
    ]
    return NodeView(node, gpus, host, said)


def _label(commitment: Commitment) -> str:
    revision = commitment.launch.revision
    return f"#{commitment.launch_id} ({revision.profile.name}@{revision.number})"


def _hidden_or_id(launch_id: int | None, hidden: set[int]) -> str:
    return "a team-only launch" if launch_id in hidden else f"#{launch_id}"
