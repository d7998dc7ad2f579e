"""Where can this revision run now? Every node and GPU set where it fits as the panel knows the
fleet now (the budget beside the launches committed there, who holds each GPU, quarantines),
ranked: fits without warnings first, then fewest other launches on the node, then most host
memory left; and for each node where it does not fit, why. Reads the database only (the model
as last read on each node, unless the caller lets it be read: ``wait``)."""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from django.db.models import Prefetch

from nodes.domain import launch_plan as plan
from nodes.domain.ownership import gpu_owners, why_taken
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import Gpu, Node, ProfileRevision, Reservation
from nodes.models.choices import NodeStatus, Role
from nodes.services import commitments, teams
from nodes.services.model_facts import ModelFacts, model_of
from nodes.services.profiles import evaluate, node_memory
from nodes.services.roles import has_role
from nodes.types import Actor


@dataclass(frozen=True)
class Candidate:
    """A node and GPU set where the revision fits now: the budget's verdict there (``ok`` or
    ``warn``), the host memory left after it (bytes), the warnings, the launches beside it."""

    node: str
    gpus: list[int]
    verdict: str
    headroom_bytes: int
    reasons: list[str] = field(default_factory=list)
    others: int = 0


@dataclass(frozen=True)
class Refused:
    """A node where the revision does not fit now, and why."""

    node: str
    reasons: list[str]


@dataclass(frozen=True)
class Placement:
    """``revision`` as ``name@N``; the candidates best first; the nodes refused."""

    revision: str
    candidates: list[Candidate]
    refused: list[Refused]

    def to_json(self) -> dict[str, Any]:
        """``{"revision", "candidates": [{"node", "gpus", "verdict", "headroom_bytes",
        "reasons"}], "refused": [{"node", "reasons"}]}``."""
        keys = ("node", "gpus", "verdict", "headroom_bytes", "reasons")
        return {
            "revision": self.revision,
            "candidates": [{k: asdict(c)[k] for k in keys} for c in self.candidates],
            "refused": [asdict(r) for r in self.refused],
        }


def place(revision: ProfileRevision, actor: Actor, *, wait: float | None = 0) -> Placement:
    """Where ``revision`` fits now, on every node, as ``actor`` may read it (another team's
    team-only launch is not named). The model is read on the nodes for an operator only, as
    ``model_facts`` reads it: with ``wait`` 0 (a page) never waiting on a node, with ``wait``
    seconds all nodes' reads asked of the workers at once and waited for together, with None
    read in place."""
    nodes = list(
        Node.objects.order_by("name").prefetch_related(
            Prefetch("gpus", queryset=Gpu.objects.order_by("index")),
            Prefetch("reservations", queryset=Reservation.objects.filter(kind="gpu")),
        )
    )
    args, env = list(revision.args), dict(revision.env or {})
    read_node = has_role(actor, Role.OPERATOR)
    usable = [n for n in nodes if _unusable(n) is None]
    if wait:  # the workers read every node at once; then one deadline for all
        for node in usable:
            model_of(node, args, read_node=read_node, wait=0)
    deadline = time.monotonic() + (wait or 0)
    candidates: list[Candidate] = []
    refused: list[Refused] = []
    for node in nodes:
        left = None if wait is None else max(0.0, deadline - time.monotonic())
        model = model_of(node, args, read_node=read_node, wait=left) if node in usable else None
        found = gpu_sets_on_node(node, args, env, model)
        if isinstance(found, Refused):
            refused.append(found)
        else:
            candidates += found
    count = _nnodes(args, nodes)
    if count > 1:
        candidates, refused = _groups(candidates, refused, count)
    candidates.sort(key=lambda c: (c.verdict != "ok", c.others, -c.headroom_bytes, c.node, c.gpus))
    name = f"{revision.profile.name}@{revision.number}"
    shown = [replace(c, reasons=teams.mask_launch_ids(actor, c.reasons)) for c in candidates]
    said = [Refused(r.node, teams.mask_launch_ids(actor, r.reasons)) for r in refused]
    return Placement(name, shown, said)


#: Node groups tried for a multi-node revision, at most (the first by name; a fleet of a few
#: dozen nodes gives far fewer pairs that fit).
MAX_GROUPS = 200


def _nnodes(args: list[str], nodes: list[Node]) -> int:
    """The revision's ``--nnodes`` (1 when it cannot be read)."""
    version = next((n.sglang_version for n in nodes if n.sglang_version), None) or DEFAULT_VERSION
    try:
        return max(1, int(parse_command(args, table(version)).get("nnodes", default=1)))
    except (TypeError, ValueError):
        return 1


def _groups(
    candidates: list[Candidate], refused: list[Refused], count: int
) -> tuple[list[Candidate], list[Refused]]:
    """A ``--nnodes count`` revision runs on ``count`` nodes at once, on the same GPU indexes
    on each (the launch takes them so): the groups of nodes with a GPU set free on all of
    them, named ``"a,b"`` (node 0 first, as the launch form and ``manage.py launch --node``
    take them). A node that fits alone is no place for it."""
    by_node: dict[str, dict[tuple[int, ...], Candidate]] = {}
    for c in candidates:
        by_node.setdefault(c.node, {})[tuple(c.gpus)] = c
    groups: list[Candidate] = []
    for names in itertools.islice(itertools.combinations(sorted(by_node), count), MAX_GROUPS):
        shared = set.intersection(*(set(by_node[n]) for n in names))
        for gpus in sorted(shared):
            parts = [by_node[n][gpus] for n in names]
            groups.append(
                Candidate(
                    ",".join(names),
                    list(gpus),
                    "warn" if any(p.verdict != "ok" for p in parts) else "ok",
                    min(p.headroom_bytes for p in parts),
                    [f"{p.node}: {why}" for p in parts for why in p.reasons],
                    sum(p.others for p in parts),
                )
            )
    if groups:
        return groups, refused
    fits = sorted(by_node)
    why = f"--nnodes {count} needs {count} nodes with the same GPUs free; " + (
        f"only {', '.join(fits)} fit{'s' if len(fits) == 1 else ''}" if fits else "none fits"
    )
    return [], [*refused, *(Refused(n, [why]) for n in fits)]


def on_node(
    node: Node, args: list[str], env: dict[str, str], model: ModelFacts | None
) -> Candidate | Refused:
    """Whether ``args`` with ``env`` (a revision's flags, or a form's) could start on ``node``
    now, beside what is committed there, on the GPUs nobody holds: the first free ones it
    needs, with the budget there; or why not (``gpu_sets_on_node``'s first set)."""
    found = gpu_sets_on_node(node, args, env, model)
    return found if isinstance(found, Refused) else found[0]


def gpu_sets_on_node(
    node: Node, args: list[str], env: dict[str, str], model: ModelFacts | None
) -> list[Candidate] | Refused:
    """Every GPU set of ``node`` where ``args`` with ``env`` could start now, beside what is
    committed there: the free GPUs in index order, taken as many at a time as the ranks need
    (GPUs 0–3 and 4–7 for TP 4 on eight free GPUs), each with the budget on its GPUs; or why
    not, from the first set. Names other launches by id only (mask them with
    ``teams.mask_launch_ids`` before showing them)."""
    if (why := _unusable(node)) or model is None:
        return Refused(node.name, [why or "unusable"])
    flags = parse_command(args, table(node.sglang_version or DEFAULT_VERSION))
    if not flags.values:
        issues = "; ".join(i.message for i in flags.issues)
        return Refused(node.name, [f"SGLang {node.sglang_version or '?'} refuses it: {issues}"])
    try:
        ranks = plan.ranks_needed(flags)
    except plan.PlanError as exc:
        return Refused(node.name, [str(exc)])
    free, taken = _free_gpus(node)
    if len(free) < ranks:
        needs = f"needs {ranks} GPU(s), {len(free)} free of {len(list(node.gpus.all()))}"
        return Refused(node.name, [needs, *taken])
    neighbours = commitments.neighbours(node)
    found: list[Candidate] = []
    first_blocks: list[str] = []
    for start in range(0, len(free) - ranks + 1, ranks):
        chosen = free[start : start + ranks]
        memory = replace(node_memory(node, chosen), neighbours=neighbours)
        report = evaluate(args, node, model, env=env, memory=memory)
        blocks = [m.text for m in report.messages if m.level == "block"]
        if blocks:
            first_blocks = first_blocks or blocks
            continue
        headroom = _headroom(node, report.host_pool_bytes_per_node or 0)
        warns = [m.text for m in report.messages if m.level == "warn"]
        # The GPUs passed over, and why: an operator sees why GPU 2 is not in the set.
        reasons = [*warns, *(f"{why} (passed over)" for why in taken)]
        found.append(
            Candidate(node.name, chosen, report.verdict, headroom, reasons, len(neighbours))
        )
    return found or Refused(node.name, first_blocks)


def _unusable(node: Node) -> str | None:
    if node.status == NodeStatus.MAINTENANCE:
        return "in maintenance"
    if node.status == NodeStatus.HOST_KEY_CHANGED:
        return "its host key changed: nothing runs there until an admin trusts the new key"
    if not node.host_key:
        return "its host key is not trusted yet"
    if node.status == NodeStatus.UNREACHABLE:
        return f"unreachable ({node.status_reason})" if node.status_reason else "unreachable"
    if not list(node.gpus.all()):
        return "no GPUs known: discover it"
    return None


def _free_gpus(node: Node) -> tuple[list[int], list[str]]:
    """The GPUs nobody holds (not reserved, not quarantined, no process, no memory held), and
    why each other one is taken."""
    reserved = {r.number: r.launch_id for r in node.reservations.all() if r.kind == "gpu"}
    quarantined = set(
        node.quarantines.filter(lifted_at__isnull=True).values_list("index", flat=True)
    )
    free, taken = [], []
    for g in node.gpus.all():
        owners = gpu_owners(
            g.index,
            g.memory_total_bytes,
            g.memory_used_bytes or 0,
            g.processes or [],
            reserved.get(g.index),
        )
        if why := why_taken(owners, quarantined=g.index in quarantined):
            taken.append(why)
        else:
            free.append(g.index)
    return free, taken


def _headroom(node: Node, pinned: int) -> int:
    """Host memory left on the node after this launch pins ``pinned`` bytes beside the others."""
    waiting = sum(n.host_bytes for n in commitments.neighbours(node) if not n.pinned)
    available = node.mem_available_bytes if node.mem_available_bytes is not None else 0
    return max(0, available - waiting - pinned)
