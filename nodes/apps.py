from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class NodesConfig(AppConfig):
    name = "nodes"
    verbose_name = "Rankwise nodes"

    def ready(self) -> None:
        from nodes import signals  # noqa: F401  (connects the login/logout audit receivers)

        post_migrate.connect(_ensure_roles, sender=self)


def _ensure_roles(**kwargs: Any) -> None:
    from nodes.services.roles import ensure_roles

    ensure_roles()
