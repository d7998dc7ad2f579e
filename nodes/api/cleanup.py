"""Cleanups: one, with its steps."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Router

from nodes.api.schemas import READ_ERRORS, CleanupOut
from nodes.services import teams

router = Router(tags=["cleanup"])


@router.get("/{cleanup_id}", response={200: CleanupOut, **READ_ERRORS})
def get_cleanup(request: HttpRequest, cleanup_id: int) -> Any:
    """A cleanup with its steps and each GPU's final state. A cleanup about another team's
    team-only launch is 404; other holders of theirs show only ``team_only``."""
    job = get_object_or_404(
        teams.visible_cleanups(request.user).select_related("node"), pk=cleanup_id
    )
    doc = job.to_json()
    teams.mask_holder_json(request.user, doc["gpus"])
    return doc
