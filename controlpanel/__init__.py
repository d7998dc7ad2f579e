"""Rankwise control panel project: settings, URLs, the Celery app and server entry points."""

from __future__ import annotations

from controlpanel.celery import app as celery_app

__all__ = ["celery_app"]
