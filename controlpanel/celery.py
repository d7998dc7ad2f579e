"""The Celery app: configuration from Django settings (CELERY_ prefix), tasks autodiscovered."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")

app = Celery("rankwise")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
