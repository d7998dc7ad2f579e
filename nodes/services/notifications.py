"""Telling a team what happened to its launches and nodes: one JSON object per event POSTed to its
webhook (and e-mailed when configured), by the workers, with retries."""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any

from django.conf import settings
from django.core.mail import send_mail

from nodes.models import (
    Launch,
    Node,
    Team,
)
from nodes.queue import QueueUnavailable, enqueue

log = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_S = 5


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def launch_event(launch: Launch, event: str, detail: str = "") -> None:
    """Tell the team that owns the launch's profile (if it listens) about ``event``."""
    team = launch.revision.profile.team
    if team is None or not (team.webhook_url or team.email):
        return
    payload = {
        "event": event,
        "launch": launch.pk,
        "status": launch.status,
        "node": launch.node.name,
        "profile": str(launch.revision),
        "detail": detail or launch.reason,
    }
    _queue(team, payload)


def node_event(node: Node, event: str, detail: str, launch: Launch | None = None) -> None:
    """A node-level event (a quarantine): the launch's team, else every team that listens."""
    teams = (
        [launch.revision.profile.team]
        if launch is not None and launch.revision.profile.team is not None
        else list(Team.objects.exclude(webhook_url="", email=""))
    )
    for team in teams:
        if team.webhook_url or team.email:
            _queue(team, {"event": event, "node": node.name, "detail": detail})


def _queue(team: Team, payload: dict[str, Any]) -> None:
    def warn(exc: QueueUnavailable) -> None:
        log.warning("team %s not told of %s: %s", team, payload, exc)

    enqueue("nodes.notify", team.pk, payload, unavailable=warn)


def deliver(team_id: int, payload: dict[str, Any]) -> None:
    """POST ``payload`` as JSON to the team's webhook, and e-mail it when configured. Raises
    ``OSError`` (urllib's errors included) so the task retries."""
    team = Team.objects.filter(pk=team_id).first()
    if team is None:
        return
    body = json.dumps({**payload, "team": team.name}).encode()
    if team.webhook_url:
        if urllib.parse.urlsplit(team.webhook_url).scheme not in ("http", "https"):
            log.warning("team %s: webhook %r is not http(s); not sent", team, team.webhook_url)
        else:
            request = urllib.request.Request(
                team.webhook_url,
                data=body,
                headers={"Content-Type": "application/json", "User-Agent": "Rankwise"},
                method="POST",
            )
            # The answer's status is all that matters: its body is not read, redirects are not
            # followed, and each network wait is bounded.
            with _OPENER.open(request, timeout=WEBHOOK_TIMEOUT_S):
                pass
    sender = settings.RANKWISE_NOTIFY_EMAIL_FROM
    if team.email and sender:
        subject = f"[Rankwise] {payload['event']}: {payload.get('profile') or payload['node']}"
        send_mail(subject, json.dumps(payload, indent=1), sender, [team.email])
