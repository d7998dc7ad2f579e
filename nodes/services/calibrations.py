"""Calibration from real launches: store what a start-up logged (``nodes.domain.calibration``)
per model folder × GPU model × TP, and hand it to the budget as observed figures next time.

A launch stores its figures when it becomes ready, for every profile of the same model × GPU
× TP (the server really started that way). A log pasted on the profile page calibrates that
profile only, until an admin promotes it to the fleet: anyone may paste anything, and one
team's paste must not loosen another team's checks. Every calibration is checked against what
the panel knows first (``calibration.check_plausible``: the GPU's memory, the checkpoint's
tensors) and refused with the reason when it cannot be right. ``manage.py budget
--calibrate-from`` reads a log for one answer and stores nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from django.db.models import Q
from django.utils import timezone

from nodes.domain.budget import NodeMemory, Observed
from nodes.domain.calibration import (
    CalibrationError,
    Figures,
    check_fits,
    check_plausible,
    parse,
    pool_settings_in,
    pool_settings_of,
)
from nodes.domain.sglang_flags import ParsedCommand
from nodes.domain.units import GiB
from nodes.models import Calibration, Launch, LaunchProfile, Node
from nodes.services import teams
from nodes.services.model_facts import known_checkpoint_bytes

log = logging.getLogger(__name__)


def tp_of(flags: ParsedCommand) -> int:
    return int(flags.get("tp_size", "tensor_parallel_size", default=1))


def ranks(flags: ParsedCommand) -> int:
    """TP × PP: the GPUs one replica takes."""
    return tp_of(flags) * int(flags.get("pp_size", "pipeline_parallel_size", default=1))


def record_ready(launch_id: int) -> Calibration | None:
    """Called when a launch becomes ready; never raises (a failed calibration must not stop
    the follower): the reason is logged."""
    from nodes.domain.sglang_flags import parse_command
    from nodes.flag_tables import table

    try:
        launch = Launch.objects.select_related("node", "revision").get(pk=launch_id)
        flags = parse_command(
            list(launch.revision.args), table(launch.node.sglang_version or "0.5.9")
        )
        return record_launch(launch, flags)
    except Exception:  # noqa: BLE001 - logged; the launch itself is fine
        log.exception("launch %s: calibration not stored", launch_id)
        return None


def used_now(memory: NodeMemory, ranks: int) -> int:
    """What the fullest of the GPUs the ranks take holds now (as the budget picks them)."""
    busy = sorted(memory.gpu_used_bytes or (0,))
    return busy[min(len(busy), max(1, ranks)) - 1]


def shown_source(calibration: Calibration) -> str:
    """Where the figures came from, as anyone may read it: ``launch #12 on node-b``, or ``a
    team-only launch on node-b`` when that launch's profile is team-only (budgets and profile
    pages are read by people outside the team, who must not learn the launch)."""
    launch_id = calibration.launch_id
    if launch_id is not None and teams.team_only_launches().filter(pk=launch_id).exists():
        return f"a team-only launch on {calibration.node_name or 'a node'}"
    return calibration.source


def label(calibration: Calibration) -> str:
    """ "calibrated from launch #12 on node-b: 72.42 GiB of weights per rank"."""
    weights = calibration.weights_per_rank_bytes / GiB
    return f"calibrated from {shown_source(calibration)}: {weights:.2f} GiB of weights per rank"


def record_launch(launch: Launch, flags: ParsedCommand) -> Calibration | None:
    """Store the figures a launch's stored log shows; None (and nothing stored) when the log
    lacks the weight lines."""
    lines = launch.lines.order_by("seq").values_list("text", flat=True)
    try:
        figures = parse(lines)
    except CalibrationError:
        return None
    settings = pool_settings_of(flags.values)
    gpus = {g.index: g for g in launch.node.gpus.all()}
    first = gpus.get(launch.gpus[0]) if launch.gpus else None
    model_path = str(flags.get("model_path", default="") or "")
    try:
        check_plausible(
            figures,
            checkpoint_bytes=known_checkpoint_bytes(launch.node, model_path),
            ranks=ranks(flags),
            gpu_memory_bytes=first.memory_total_bytes if first else None,
        )
    except CalibrationError as exc:
        log.warning("launch %s: calibration not stored: %s", launch.pk, exc)
        return None
    used = [int(v) for v in (launch.gpu_used_before or {}).values()]
    return _store(
        figures,
        model_path=model_path,
        gpu_name=first.name if first else "",
        tp=tp_of(flags),
        node=launch.node,
        source=f"launch #{launch.pk} on {launch.node.name}",
        launch=launch,
        used_before=max(used, default=0),
        created_by=launch.created_by,
        settings=settings,
    )


def record_log(
    lines: Iterable[str],
    *,
    node: Node,
    flags: ParsedCommand,
    profile: LaunchProfile | None,
    actor: str,
    checkpoint_bytes: int | None,
) -> Calibration:
    """Store a pasted log's figures for the profile's model on ``node``'s GPU model, for that
    profile only; raises ``CalibrationError`` with the reason when the log cannot calibrate:
    another model or TP size, or figures this model cannot give on this GPU (``checkpoint_bytes``,
    the model's tensors as read on the node, None when unknown)."""
    lines = list(lines)
    figures = parse(lines)
    model_path = str(flags.get("model_path", default="") or "")
    check_fits(figures, model_path, tp_of(flags))
    first = node.gpus.order_by("index").first()
    if checkpoint_bytes is None:
        # Anyone may paste anything: figures nothing can be checked against are not taken.
        raise CalibrationError(
            f"the model at {model_path or '?'} has not been read on {node.name} yet, so its "
            "figures cannot be checked against its checkpoint: check the revision (which reads "
            "the model there), then paste the log again"
        )
    check_plausible(
        figures,
        checkpoint_bytes=checkpoint_bytes,
        ranks=ranks(flags),
        gpu_memory_bytes=first.memory_total_bytes if first else None,
    )
    settings = pool_settings_in(lines) or {}
    return _store(
        figures,
        model_path=model_path,
        gpu_name=first.name if first else "",
        tp=tp_of(flags),
        node=node,
        source=f"a log pasted by {actor}",
        profile=profile,
        created_by=actor,
        settings=settings,
    )


def _store(
    figures: Figures,
    *,
    model_path: str,
    gpu_name: str,
    tp: int,
    node: Node | None,
    source: str,
    launch: Launch | None = None,
    profile: LaunchProfile | None = None,
    used_before: int = 0,
    created_by: str = "",
    settings: dict[str, str] | None = None,
) -> Calibration:
    return Calibration.objects.create(
        model_path=model_path[:1024],
        gpu_name=gpu_name,
        tp_size=tp,
        node=node,
        node_name=node.name if node else "",
        launch=launch,
        profile=profile,
        source=source[:200],
        free_before_load_bytes=figures.free_before_load_bytes,
        weights_per_rank_bytes=figures.weights_per_rank_bytes,
        kv_tokens=figures.kv_tokens,
        pool_settings=settings or {},
        gpu_used_before_bytes=used_before,
        ranks=figures.to_json()["ranks"],
        created_by=created_by[:150],
    )


def applying_to(profile_name: str | None) -> Q:
    """The calibrations that apply to a profile's checks: every launch's and every promoted
    one, and the profile's own pasted logs (None: no profile's, as for an ad-hoc command)."""
    scope = Q(launch__isnull=False) | Q(promoted_at__isnull=False)
    return scope | Q(profile__name=profile_name) if profile_name else scope


def plausible(
    calibration: Calibration, checkpoint_bytes: int | None, ranks: int, gpu_memory_bytes: int | None
) -> str | None:
    """Why the stored figures cannot be right for the checkpoint known now (None: they can)."""
    figures = Figures(
        free_before_load_bytes=calibration.free_before_load_bytes,
        weights_per_rank_bytes=calibration.weights_per_rank_bytes,
        kv_tokens=calibration.kv_tokens,
        ranks=(),
    )
    try:
        check_plausible(
            figures,
            checkpoint_bytes=checkpoint_bytes,
            ranks=ranks,
            gpu_memory_bytes=gpu_memory_bytes,
        )
    except CalibrationError as exc:
        return str(exc)
    return None


def latest(
    model_path: str,
    gpu_names: Iterable[str],
    tp: int,
    profile_name: str | None = None,
    *,
    checkpoint_bytes: Callable[[], int | None] = lambda: None,
    ranks: int = 1,
) -> Calibration | None:
    """The newest calibration of the model folder on one of these GPU models at this TP that
    applies to the profile ``profile_name`` (None: to any check, so fleet-wide ones only) and
    is possible for the checkpoint as known now (``checkpoint_bytes()`` over ``ranks``, asked
    only when there is a calibration to check: figures stored before it was known are checked
    again at every use)."""
    names = {n for n in gpu_names if n}
    if not model_path or not names:
        return None
    found = (
        Calibration.objects.filter(model_path=model_path, gpu_name__in=names, tp_size=tp)
        .filter(applying_to(profile_name))
        .order_by("-created", "-id")
    )
    candidates = list(found[:20])
    known = checkpoint_bytes() if candidates else None
    return next((c for c in candidates if plausible(c, known, ranks, None) is None), None)


def promote(calibration: Calibration, actor: str) -> None:
    """Let a pasted log's figures calibrate every profile of its model × GPU × TP, once they
    are checked again against the checkpoint as known now; raises ``CalibrationError`` with
    the reason when they cannot be (unknown checkpoint, impossible figures)."""
    node = calibration.node
    known = known_checkpoint_bytes(node, calibration.model_path) if node is not None else None
    if known is None:
        raise CalibrationError(
            "its model has not been read on its node, so its figures cannot be checked"
        )
    gpu = node.gpus.order_by("index").first() if node is not None else None
    ranks_of = max(1, calibration.tp_size)  # a pasted log's ranks: its TP size (PP 1)
    if why := plausible(calibration, known, ranks_of, gpu.memory_total_bytes if gpu else None):
        raise CalibrationError(why)
    calibration.promoted_by, calibration.promoted_at = actor[:150], timezone.now()
    calibration.save(update_fields=["promoted_by", "promoted_at"])


def observed_for(
    flags: ParsedCommand,
    gpu_names: Iterable[str],
    used_now: int = 0,
    profile_name: str | None = None,
    checkpoint_bytes: Callable[[], int | None] = lambda: None,
) -> tuple[Observed | None, Calibration | None]:
    """Observed figures for the budget from the newest calibration that applies and is possible
    for the checkpoint (``latest``), its free memory before load moved by what the GPUs hold now
    compared with then; (None, None) if none."""
    found = latest(
        str(flags.get("model_path", default="") or ""),
        gpu_names,
        tp_of(flags),
        profile_name,
        checkpoint_bytes=checkpoint_bytes,
        ranks=ranks(flags),
    )
    if found is None:
        return None, None
    free = found.free_before_load_bytes + found.gpu_used_before_bytes - used_now
    return (
        Observed(
            free_before_load_bytes=max(0, free),
            weights_per_rank_bytes=found.weights_per_rank_bytes,
            label=label(found),
            kind="calibrated",
        ),
        found,
    )
