"""ASGI entry point (uvicorn serves it; live log streams need an async server)."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

from controlpanel.body_limit import BodyLimit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")

application = BodyLimit(
    get_asgi_application(),
    limits=settings.REQUEST_BODY_LIMITS,
    default=settings.REQUEST_BODY_MAX_BYTES,
)
