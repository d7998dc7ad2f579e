"""Cleanups: one, with its steps."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Router

from nodes.api.schemas import READ_ERRORS, CleanupOut
from nodes.services.teams import visible_cleanups

router = Router(tags=["cleanup"])


@router.get("/{cleanup_id}", response={200: CleanupOut, **READ_ERRORS})
def get_cleanup(request: HttpRequest, cleanup_id: int) -> Any:
    job = get_object_or_404(visible_cleanups(request.user).select_related("node"), pk=cleanup_id)
    return job.to_json()
