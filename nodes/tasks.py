"""Celery tasks: take ids, call one service, own retries and time limits."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from nodes import ssh
from nodes.services import discovery


@shared_task(name="nodes.discover_node", soft_time_limit=150, time_limit=180)
def discover_node(node_id: int) -> dict[str, Any]:
    """Discover one node; returns its facts as JSON, or ``{"error": …, "kind": …}``."""
    try:
        return discovery.discover(node_id).to_json()
    except ssh.RemoteError as exc:
        return {"error": exc.message, "kind": exc.kind}


@shared_task(name="nodes.heartbeat", soft_time_limit=60, time_limit=90, expires=60)
def heartbeat() -> int:
    """Refresh every node's live state; returns how many nodes answered."""
    return sum(o.facts is not None for o in discovery.heartbeat_sweep())
