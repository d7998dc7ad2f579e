"""What a model is, for the budget: its geometry and checkpoint size from a pasted config.json,
or from what the node agent read of the folder on the node (config.json and the safetensors
headers, never the tensors), kept as a ``ModelReading``.

Pages never wait on the node: they ask with ``wait`` (seconds), which queues the read for a
worker (``nodes.read_model``) and waits at most that long for the stored answer (not at all
inside a transaction), else answers ``pending`` ("reading … on …") and the page polls.
Workers and the CLI read in place (``wait=None``). A reading is fresh for ``GEOMETRY_TTL_S``;
after that the folder is asked again with its stamp (total size, newest mtime), and the
headers are read again only when the stamp changed.
"""

from __future__ import annotations

import json
import posixpath
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from nodes import ssh
from nodes.domain.geometry import GeometryError, ModelGeometry, from_config
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import table
from nodes.models import ModelReading, Node
from nodes.models.choices import NodeStatus
from nodes.queue import QueueUnavailable, send
from nodes.remote import client as agent
from nodes.services.credentials import target_for

GEOMETRY_TTL_S = 600
ERROR_TTL_S = 30  # a folder that could not be read is asked again soon: it may be copied now
#: A read queued this long ago without an answer (its worker died) is queued again.
REQUEST_STALE_S = 60
POLL_S = 0.2
#: A folder's reading not asked for this long is deleted (one row per node and folder ever
#: named would otherwise grow without end); asked again, it is read again.
KEEP_S = 7 * 24 * 3600
PATH_MAX = 1024  # ModelReading.model_path's width, as the profile form bounds it
HUB = "SGLang looks it up on the Hugging Face Hub"
#: What each agent problem means, said of ``{path}`` on ``{node}``.
PROBE_PROBLEMS = {
    "no-folder": "no model folder at {path} on {node}",
    "no-config": "no config.json in {path} on {node}",
    "denied": "{path} on {node} may not be read (permission denied)",
    "bad-config": "{path}/config.json on {node} is not a JSON object",
    "unreadable": "{path} on {node} could not be read",
}
#: Why a viewer's check shows no model geometry: reading on a node needs the operator role.
NOT_READ_FOR_VIEWERS = "not read (reading the model on the node needs the operator role)"


@dataclass(frozen=True)
class ModelFacts:
    """The model's geometry and checkpoint size (bytes), and where they came from (for the
    page). ``pending``: a worker is reading it on the node; ask again in a moment."""

    geometry: ModelGeometry | None
    weights_bytes: int | None
    source: str
    pending: bool = False
    #: The node has no such model folder (or no config.json in it), in words: SGLang cannot
    #: start from it, so a revision naming it is blocked there.
    missing: str | None = None


def model_facts(
    node: Node,
    model_path: str,
    pasted_config: str = "",
    *,
    read_node: bool = True,
    wait: float | None = None,
) -> ModelFacts:
    """The geometry from a pasted config.json, else as read on the node: in place when
    ``wait`` is None, else by a worker within ``wait`` s. With ``wait=0`` (a page that polls)
    it is ``pending`` until the worker answered; with more, a save goes on without the geometry
    when it did not answer in time ("not read from gpu-01: no worker read it within 30 s"), as
    for a node that is away. Nothing is read when ``read_node`` is false (a viewer's check:
    nothing runs on the node for them). A problem is said in ``source`` in plain words ("no
    model folder at /x on gpu-01")."""
    if pasted_config.strip():
        return _pasted(pasted_config)
    if not model_path or not node.host_key:
        return ModelFacts(None, None, "not read (the node's host key is not trusted yet)")
    if not read_node:
        return ModelFacts(None, None, NOT_READ_FOR_VIEWERS)
    if not model_path.startswith("/"):
        return ModelFacts(None, None, f"not read: {model_path[:200]} is not a local path ({HUB})")
    if len(model_path) > PATH_MAX:
        return ModelFacts(
            None, None, f"not read: the model path is longer than {PATH_MAX:,} characters"
        )
    # One reading per folder: /srv/models/x/. and /srv/models/x are the same folder.
    model_path = posixpath.normpath(model_path)
    if node.status == NodeStatus.HOST_KEY_CHANGED:
        # Not even a stored reading: what the node holds now cannot be known safely.
        why = node.status_reason or "its host key changed"
        return ModelFacts(None, None, f"not read: {node.name} cannot be reached safely: {why}")
    reading = _fresh(node, model_path)
    if reading is not None:
        return _facts(node, model_path, reading)
    if wait is None:
        return _facts(node, model_path, read_now(node, model_path))
    reading, waited = _awaited(node, model_path, wait)
    if reading is not None:
        return _facts(node, model_path, reading)
    if not wait:
        return ModelFacts(None, None, f"reading {model_path} on {node.name}…", pending=True)
    # A save goes on without the geometry, as for a node that is away.
    why = f"no worker had read it after {waited:g} s"
    return ModelFacts(None, None, f"not read from {node.name}: {why}")


def not_read(model: ModelFacts) -> dict[str, str] | None:
    """The ``model-not-read`` message (``{"level", "code", "text"}``) that says why a budget
    went without the model's geometry, in the form's words; None when it was read."""
    if model.geometry is not None:
        return None
    return {"level": "info", "code": "model-not-read", "text": f"Model geometry: {model.source}"}


def model_of(
    node: Node, args: list[str], *, read_node: bool = True, wait: float | None = None
) -> ModelFacts:
    """The geometry of the model ``args`` serve (their ``--model-path``), read on ``node``
    as ``model_facts`` reads it."""
    flags = parse_command(list(args), table(node.sglang_version))
    path = str(flags.get("model_path", default="") or "")
    return model_facts(node, path, read_node=read_node, wait=wait)


def stored_answer(node: Node, args: list[str]) -> dict[str, Any]:
    """What the panel last read on ``node`` of the model ``args`` serve (``{"config": {…},
    "weights_bytes": int, …}``), however old; ``{}`` when it never read it. Reads nothing."""
    flags = parse_command(list(args), table(node.sglang_version))
    path = str(flags.get("model_path", default="") or "")
    if not path.startswith("/") or len(path) > PATH_MAX:
        return {}
    row = ModelReading.objects.filter(node=node, model_path=posixpath.normpath(path)).first()
    return dict(row.answer) if row is not None and isinstance(row.answer, dict) else {}


def read_now(node: Node, model_path: str) -> ModelReading:
    """Ask the node's agent for the folder (with the stamp of what it read before) and store
    the answer or the reason it could not be read. Never raises for the node."""
    stamp = stamp_of(node, model_path)
    try:
        with ssh.pool.session(target_for(node)) as conn:
            answer, error = agent.model_folder(conn, model_path, stamp), ""
    except ssh.RemoteError as exc:
        answer, error = None, _why_not(node, exc)
    return record(node, model_path, answer, error)


def local_folder(model_path: str) -> str:
    """The folder ``model_facts`` reads for ``model_path`` (normalised), or ``""`` for a path
    it does not read on the node (a Hub id, one too long)."""
    if not model_path.startswith("/") or len(model_path) > PATH_MAX:
        return ""
    return posixpath.normpath(model_path)


def stamp_of(node: Node, model_path: str) -> str | None:
    """The stamp of what was last read of the folder at this node's address (None: nothing),
    for the agent to answer ``unchanged`` when it still holds."""
    row = ModelReading.objects.filter(node=node, model_path=model_path, host=node.host).first()
    if row is None or not isinstance(row.answer, dict):
        return None
    return str(row.answer.get("stamp") or "") or None


def record(
    node: Node, model_path: str, answer: agent.ModelFolder | None, error: str = ""
) -> ModelReading:
    """Store what the agent answered of the folder (or ``error``, why nothing was read) as the
    node's reading of it, fresh from now."""
    row = _row(node, model_path)
    before = row.answer if isinstance(row.answer, dict) and row.host == node.host else None
    if answer is not None and answer.unchanged and before:
        doc: dict[str, Any] | None = before
    elif answer is not None and answer.config is not None:
        doc = answer.to_json()
    else:
        doc = None
        if answer is not None:
            words = PROBE_PROBLEMS.get(str(answer.problem), PROBE_PROBLEMS["unreadable"])
            error = words.format(path=model_path, node=node.name)
    ModelReading.objects.filter(pk=row.pk).update(
        host=node.host, answer=doc, error=error, read_at=timezone.now(), requested_at=None
    )
    row.refresh_from_db()
    return row


def _pasted(text: str) -> ModelFacts:
    try:
        return ModelFacts(from_config(json.loads(text)), None, "pasted config.json")
    except RecursionError:
        return ModelFacts(None, None, "the pasted config.json is nested too deeply")
    except (ValueError, GeometryError) as exc:
        return ModelFacts(None, None, f"the pasted config.json is unusable: {str(exc)[:200]}")


def _why_not(node: Node, exc: ssh.RemoteError) -> str:
    if exc.kind == "command_failed":
        # What the interpreter printed is for the node's admin, not the page.
        if exc.exit_status is not None:
            return (
                f"not read from {node.name}: the model probe failed (exit status {exc.exit_status})"
            )
        return f"not read from {node.name}: unexpected output"
    return f"not read from {node.name}: {exc.message}"


def _row(node: Node, model_path: str) -> ModelReading:
    try:
        with transaction.atomic():
            row, _ = ModelReading.objects.get_or_create(
                node=node, model_path=model_path, defaults={"host": node.host}
            )
    except IntegrityError:  # made a moment ago by another request
        row = ModelReading.objects.get(node=node, model_path=model_path)
    return row


def known_checkpoint_bytes(node: Node, model_path: str) -> int | None:
    """The checkpoint's size (bytes of its tensors) as last read on the node, however long ago
    (a checkpoint rarely changes, and a stale size is better than none for judging whether a
    figure is possible); None when the folder was never read there."""
    if not model_path:
        return None
    row = ModelReading.objects.filter(
        node=node, model_path=posixpath.normpath(model_path), host=node.host
    ).first()
    answer = row.answer if row is not None else None
    size = answer.get("weights_bytes") if isinstance(answer, dict) else None
    return size if isinstance(size, int) and size > 0 else None


def _fresh(node: Node, model_path: str) -> ModelReading | None:
    """The stored reading, if it is recent enough to use and of the node's current address."""
    row = ModelReading.objects.filter(node=node, model_path=model_path, host=node.host).first()
    if row is None or row.read_at is None:
        return None
    ttl = GEOMETRY_TTL_S if row.answer else ERROR_TTL_S
    return row if timezone.now() - row.read_at < timedelta(seconds=ttl) else None


def _awaited(node: Node, model_path: str, wait: float) -> tuple[ModelReading | None, float]:
    """Queue a worker's read (once per ``REQUEST_STALE_S``) and wait at most ``wait`` s for a
    reading fresher than the request; ``(reading or None, seconds waited)``."""
    asked = timezone.now()
    row = _row(node, model_path)
    stale = asked - timedelta(seconds=REQUEST_STALE_S)
    if row.requested_at is None or row.requested_at < stale:
        ModelReading.objects.filter(pk=row.pk).update(requested_at=asked)
        try:
            send("nodes.read_model", node.pk, model_path)
        except QueueUnavailable as exc:
            ModelReading.objects.filter(pk=row.pk).update(requested_at=None)
            return _unqueued(row, node, exc), 0
    if transaction.get_connection().in_atomic_block:
        wait = 0  # the worker's answer could not be seen (nor, on SQLite, written) before commit
    deadline = time.monotonic() + wait
    while True:
        found = _fresh(node, model_path)
        if found is not None or time.monotonic() >= deadline:
            return found, wait
        time.sleep(POLL_S)  # polling the database: the worker writes the reading there


def _unqueued(row: ModelReading, node: Node, exc: QueueUnavailable) -> ModelReading:
    """A reading that says the read could not be queued (shown as the model's source)."""
    row.answer, row.error = None, f"not read from {node.name}: {exc}"
    return row


#: The agent's problems that mean the folder is not a model on the node at all.
MISSING = ("no-folder", "no-config")


def _facts(node: Node, model_path: str, reading: ModelReading) -> ModelFacts:
    doc = reading.answer
    if not isinstance(doc, dict) or "config" not in doc:
        missing = {PROBE_PROBLEMS[p].format(path=model_path, node=node.name) for p in MISSING}
        error = reading.error or f"not read from {node.name}"
        return ModelFacts(None, None, error, missing=error if error in missing else None)
    try:
        geometry = from_config(doc["config"])
    except GeometryError as exc:
        return ModelFacts(None, doc.get("weights_bytes"), f"{model_path}/config.json: {exc}")
    tensors = doc.get("tensors")
    if isinstance(tensors, list):
        geometry = replace(geometry, tensors=tuple(tensors))
    else:  # the budget's weights line says so
        note = str(doc.get("headers_error") or "no safetensors headers")[:200]
        geometry = replace(geometry, headers_note=f"headers not read: {note}")
    return ModelFacts(geometry, doc.get("weights_bytes"), f"read from {node.name}:{model_path}")


def prune() -> int:
    """Delete the readings neither read nor asked for in ``KEEP_S``; how many went."""
    cutoff = timezone.now() - timedelta(seconds=KEEP_S)
    stale = ModelReading.objects.filter(
        Q(read_at__lt=cutoff) | Q(read_at__isnull=True),
        Q(requested_at__lt=cutoff) | Q(requested_at__isnull=True),
    )
    return stale.delete()[0]
