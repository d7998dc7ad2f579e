"""Bundles uploaded to ``/diagnose/``: stored as uploaded, then read and diagnosed by a worker.

The web process only copies the (compressed, size-bounded) upload into the database; the worker
decompresses it with the bounds of :func:`bundles.read_bundle_file` and stores what the page
shows, so a decompression bomb costs a worker a bounded read, never the web process.
"""

from __future__ import annotations

import io
import uuid
from datetime import timedelta
from typing import IO, Any

from django.utils import timezone

from nodes.domain.bundle import BundleError
from nodes.domain.redact import mask_assignments
from nodes.models import BundleUpload
from nodes.services import bundles, diagnoses

KEPT_FOR = timedelta(days=1)


def store(upload: IO[bytes] | Any, owner: Any) -> BundleUpload:
    """Keep ``upload`` (a Django ``UploadedFile``, already size-checked by the form) for the
    worker; uploads older than ``KEPT_FOR`` are dropped on the way."""
    BundleUpload.objects.filter(created__lt=timezone.now() - KEPT_FOR).delete()
    data = b"".join(upload.chunks()) if hasattr(upload, "chunks") else upload.read()
    return BundleUpload.objects.create(
        owner=owner, name=str(getattr(upload, "name", "bundle"))[:200], data=data
    )


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
    found = diagnoses.diagnose_bundle(text, facts)
    lines = text.splitlines()
    excerpts = []
    for evidence in found.evidence:
        inside = evidence.line is not None and 0 < evidence.line <= len(lines)
        shown = lines[evidence.line - 1] if inside and evidence.line else evidence.text
        excerpts.append([evidence.line, mask_assignments(shown)])
    return {
        "diagnosis": found.to_json(),
        "summary": mask_assignments(found.summary),
        "excerpts": excerpts,
        "line_count": len(lines),
    }
