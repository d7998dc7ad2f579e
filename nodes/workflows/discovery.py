"""Discovery: learn a node's hardware over SSH, keep watching it, and never show a wrong inventory
silently.

``discover`` runs the full probe and saves what it found; ``heartbeat_sweep`` runs the light
probe on every node in parallel, each with its own timeout, so one dead node cannot delay the
others."""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from django.http import HttpRequest

from nodes import ssh
from nodes.domain.probe_parse import (
    NodeFacts,
)
from nodes.models import (
    Node,
)
from nodes.models.choices import (
    NodeStatus,
)
from nodes.services import model_facts, readings
from nodes.services.audit import record
from nodes.services.credentials import target_for
from nodes.services.readings import save_live, save_unreachable
from nodes.types import Actor

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Outcome:
    """One node's probe: the facts, or the error that stopped it."""

    node_id: int
    facts: NodeFacts | None
    error: ssh.RemoteError | None


def discover(
    node_id: int, *, actor: Actor | None = None, request: HttpRequest | None = None
) -> NodeFacts:
    """Full discovery of one node, saved; raises ``ssh.RemoteError`` after recording it."""
    node = Node.objects.select_related("credential").get(pk=node_id)
    if actor is not None:
        record("node.discover", actor=actor, obj=node, request=request)
    try:
        facts = readings.probe(node)
    except ssh.RemoteError as exc:
        save_unreachable(node, exc)
        raise
    readings.save_facts(node, facts)
    return facts


def heartbeat_sweep(timeout: float = HEARTBEAT_TIMEOUT_S) -> list[Outcome]:
    """Probe every node at once (light probe), each bounded by ``timeout`` seconds; save all."""
    # Nodes without a trusted host key, or whose key changed, are not contacted at all until
    # an admin trusts one.
    nodes = list(
        Node.objects.select_related("credential")
        .exclude(host_key="")
        .exclude(status=NodeStatus.HOST_KEY_CHANGED)
    )
    if not nodes:
        return []
    started = time.monotonic()
    outcomes: dict[int, Outcome] = {}
    with ThreadPoolExecutor(max_workers=min(64, len(nodes))) as executor:
        futures = {executor.submit(_probe_quietly, n, timeout): n for n in nodes}
        done, _ = wait(futures, timeout=timeout + 2)
        for future, node in futures.items():
            if future in done:
                outcomes[node.pk] = future.result()
            else:
                error = ssh.RemoteError("timeout", f"no answer within {timeout:g} s")
                outcomes[node.pk] = Outcome(node.pk, None, error)
                with contextlib.suppress(ssh.RemoteError):
                    ssh.pool.drop(target_for(node))
        # Threads still stuck on a dead link are abandoned, not waited for.
        executor.shutdown(wait=False, cancel_futures=True)
    for node in nodes:
        outcome = outcomes[node.pk]
        if outcome.facts is not None:
            save_live(node, outcome.facts)
        elif outcome.error is not None:
            save_unreachable(node, outcome.error)
    pruned = model_facts.prune()
    log.info(
        "heartbeat: %d nodes in %.2f s (%d stale model readings pruned)",
        len(nodes),
        time.monotonic() - started,
        pruned,
    )
    return list(outcomes.values())


def _probe_quietly(node: Node, timeout: float) -> Outcome:
    try:
        # A fresh handshake each time: the pooled connection would not notice a changed key.
        ssh.check_host_key(target_for(node), timeout=min(timeout, ssh.CONNECT_TIMEOUT_S))
        return Outcome(node.pk, readings.probe(node, live=True, timeout=timeout), None)
    except ssh.RemoteError as exc:
        return Outcome(node.pk, None, exc)
