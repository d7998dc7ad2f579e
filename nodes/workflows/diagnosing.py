"""Diagnosing: a failed launch from what the panel holds (log, facts, snapshots), stored on the
launch with the flag changes its remedy suggests; an uploaded bundle, read by a worker.

The engine is ``nodes.domain.diagnosis``; the first diagnosis of a launch tells its team."""

from __future__ import annotations

import io
import uuid
from typing import Any

from nodes.domain import remedy
from nodes.domain.bundle import BundleError
from nodes.domain.diagnosis import Diagnosis
from nodes.domain.redact import mask_assignments
from nodes.models import (
    BundleUpload,
    Launch,
)
from nodes.services import bundles, notifications
from nodes.services.bundle_fix import change_of
from nodes.services.fixes import budget_suggestion, checked_change


def diagnose_launch(launch_id: int) -> Diagnosis | None:
    """Diagnose a failed launch from what the panel holds (log, facts, snapshots) and store the
    answer with the flag changes its remedy suggests. ``None`` if the launch did not fail."""
    launch = Launch.objects.select_related("node", "revision__profile").get(pk=launch_id)
    if launch.status != "failed":
        return None
    found = bundles.diagnose_bundle(bundles.launch_log_text(launch), bundles.facts_of(launch))
    doc = found.to_json()
    doc["changes"], doc["fix_check"] = checked_change(
        launch, remedy.changes_for(found.category, found.numbers, budget_suggestion(launch))
    )
    first = launch.diagnosis is None
    Launch.objects.filter(pk=launch_id).update(diagnosis=doc, diagnosis_category=found.category)
    if first:
        notifications.launch_event(launch, "launch.failed", f"{found.category}: {found.summary}")
    return found


def diagnose_upload(upload_id: uuid.UUID | str) -> str:
    """Read and diagnose a stored upload once; returns its status. The archive is dropped once
    read, the page's view of the result (secrets masked) kept."""
    job = BundleUpload.objects.filter(pk=upload_id, status=BundleUpload.Status.PENDING).first()
    if job is None:
        return "gone"
    archive = io.BytesIO(bytes(job.data))
    archive.name = job.name
    try:
        text, facts = bundles.read_bundle_file(archive)
    except BundleError as exc:
        status, result = BundleUpload.Status.REFUSED, {"error": str(exc)}
    else:
        status, result = BundleUpload.Status.DONE, _shown(text, facts)
    BundleUpload.objects.filter(pk=job.pk).update(status=status, result=result, data=b"")
    return str(status)


def _shown(text: str, facts: dict[str, Any]) -> dict[str, Any]:
    """What the page shows of a bundle's diagnosis: evidence lines as the log has them, and
    every secret the log spells out masked (the panel knows none of this server's values)."""
    found = bundles.diagnose_bundle(text, facts)
    lines = text.splitlines()
    excerpts = []
    for evidence in found.evidence:
        inside = evidence.line is not None and 0 < evidence.line <= len(lines)
        shown = lines[evidence.line - 1] if inside and evidence.line else evidence.text
        excerpts.append([evidence.line, mask_assignments(shown)])
    change = change_of(found, facts)
    return {
        "diagnosis": found.to_json(),
        "summary": mask_assignments(found.summary),
        "excerpts": excerpts,
        "line_count": len(lines),
        # As ``manage.py diagnose --json`` gives it: checked on the bundle's node.
        "change": remedy.describe(change) if change else "",
    }
