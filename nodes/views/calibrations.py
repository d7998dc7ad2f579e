"""Calibration on the profile page: the figures real start-ups logged for the profile's model
(estimate vs observed, with the error in percent), and a pasted log from a server launched
outside Rankwise calibrating later estimates the same way a launch does."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpResponseBase
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_POST

from nodes.domain.calibration import CalibrationError, pool_settings_of, settings_differ
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import Calibration, LaunchProfile
from nodes.models.choices import Role
from nodes.services import calibrations
from nodes.services.audit import record
from nodes.services.model_facts import known_checkpoint_bytes
from nodes.services.teams import visible_profiles
from nodes.views.http import HtmxHttpRequest, after_post, role_required

LOG_MAX_CHARS = 4_000_000


def rows(profile: LaunchProfile) -> list[dict[str, Any]]:
    """Calibrations of the newest revision's model folder at its TP size, newest first, each
    beside that revision's estimate: ``calibration``, ``estimate``, ``error`` (percent text)."""
    latest = profile.revisions.order_by("-number").first()
    if latest is None:
        return []
    flags = parse_command(list(latest.args), table(latest.sglang_version or DEFAULT_VERSION))
    path = str(flags.get("model_path", default="") or "")
    tp = calibrations.tp_of(flags)
    estimate = (latest.report or {}).get("device_kv_tokens_per_rank")
    asked = pool_settings_of(flags.values)
    found = []
    # The fleet's and this profile's own: another profile's pasted log is none of its business
    # (it may be another team's, and it calibrates nothing here).
    mine = Calibration.objects.filter(model_path=path, tp_size=tp).filter(
        calibrations.applying_to(profile.name)
    )
    for c in mine[:10]:
        # Like with like: a pool sized under other settings measures nothing of this one.
        differs = settings_differ(c.pool_settings or {}, asked)
        if differs:
            error = f"not compared: it ran with {differs}"
        elif estimate and c.kv_tokens:
            error = f"{(estimate - c.kv_tokens) / c.kv_tokens * 100:+.1f} %"
            if not c.pool_settings:
                error += " (the KV settings it ran with are not in its log)"
        else:
            error = "—"
        found.append(
            {
                "calibration": c,
                "applies": "every profile" if c.fleet_wide else "this profile",
                "source": calibrations.shown_source(c),
                "estimate": estimate,
                "error": error,
            }
        )
    return found


@require_POST
@role_required(Role.OPERATOR)
def profile_calibrate(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    """Store a pasted start-up log's figures for the newest revision's model, GPU model and TP."""
    profile = get_object_or_404(visible_profiles(request.user), pk=pk)
    back = reverse("nodes:profile-detail", args=[profile.pk])
    latest = profile.revisions.select_related("node").order_by("-number").first()
    text = request.POST.get("log", "")
    if latest is None or latest.node is None:
        messages.error(request, "Save a revision checked on a node first: the log calibrates it.")
        return after_post(request, back)
    if not text.strip() or len(text) > LOG_MAX_CHARS or "\x00" in text:
        messages.error(request, "Paste the server's start-up log (text, at most 4 MB).")
        return after_post(request, back)
    flags = parse_command(list(latest.args), table(latest.sglang_version or DEFAULT_VERSION))
    path = str(flags.get("model_path", default="") or "")
    # What the panel knows of the checkpoint (as last read on the node, however long ago).
    checkpoint = known_checkpoint_bytes(latest.node, path)
    try:
        found = calibrations.record_log(
            text.splitlines(),
            node=latest.node,
            flags=flags,
            profile=profile,
            actor=request.user.get_username(),
            checkpoint_bytes=checkpoint,
        )
    except CalibrationError as exc:
        messages.error(request, f"That log cannot calibrate: {exc}.")
        return after_post(request, back)
    record(
        "profile.calibrate",
        actor=request.user,
        obj=profile,
        after={
            "calibration": found.pk,
            "free_before_load_bytes": found.free_before_load_bytes,
            "weights_per_rank_bytes": found.weights_per_rank_bytes,
            "kv_tokens": found.kv_tokens,
        },
        request=request,
    )
    messages.success(
        request,
        f"{profile.name}: {calibrations.label(found)}. It calibrates this profile's checks only, "
        "until an admin applies it to every profile of this model.",
    )
    return after_post(request, back)


@require_POST
@role_required(Role.ADMIN)
def calibration_promote(request: HtmxHttpRequest, pk: int) -> HttpResponseBase:
    """Let a pasted log's figures calibrate every profile of its model × GPU × TP (admin)."""
    calibration = get_object_or_404(Calibration, pk=pk)
    profile = calibration.profile
    back = (
        reverse("nodes:profile-detail", args=[profile.pk])
        if profile is not None
        else reverse("nodes:profile-list")
    )
    if calibration.fleet_wide:
        messages.info(request, "That calibration applies to every profile already.")
        return after_post(request, back)
    try:
        calibrations.promote(calibration, request.user.get_username())
    except CalibrationError as exc:
        messages.error(request, f"Not applied to every profile: {exc}.")
        return after_post(request, back)
    record(
        "calibration.promote",
        actor=request.user,
        obj=calibration,
        after={"model_path": calibration.model_path, "gpu_name": calibration.gpu_name},
        request=request,
    )
    messages.success(request, f"The {calibration} applies to every profile now.")
    return after_post(request, back)
