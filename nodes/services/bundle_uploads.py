"""Bundles uploaded to ``/diagnose/``: stored as uploaded, then read and diagnosed by a worker.

The web process only copies the (compressed, size-bounded) upload into the database; the worker
decompresses it with the bounds of :func:`bundles.read_bundle_file` and stores what the page
shows, so a decompression bomb costs a worker a bounded read, never the web process.
"""

from __future__ import annotations

from datetime import timedelta
from typing import IO, Any

from django.utils import timezone

from nodes.models import BundleUpload

KEPT_FOR = timedelta(days=1)


def store(upload: IO[bytes] | Any, owner: Any) -> BundleUpload:
    """Keep ``upload`` (a Django ``UploadedFile``, already size-checked by the form) for the
    worker; uploads older than ``KEPT_FOR`` are dropped on the way."""
    BundleUpload.objects.filter(created__lt=timezone.now() - KEPT_FOR).delete()
    data = b"".join(upload.chunks()) if hasattr(upload, "chunks") else upload.read()
    return BundleUpload.objects.create(
        owner=owner, name=str(getattr(upload, "name", "bundle"))[:200], data=data
    )
