"""ASGI entry point (uvicorn serves it; live log streams need an async server)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")

application = get_asgi_application()
