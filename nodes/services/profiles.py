"""Launch profiles: check a profile against a node's memory and save it as a new revision."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.cache import cache
from django.db import transaction
from django.db.models import Max
from django.http import HttpRequest

from nodes import ssh
from nodes.audit import record
from nodes.domain.budget import BudgetReport, NodeMemory, check
from nodes.domain.geometry import GeometryError, ModelGeometry, from_config
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import table
from nodes.models import LaunchProfile, Node, ProfileRevision
from nodes.services.credentials import target_for

Actor = AbstractBaseUser | AnonymousUser
DEFAULT_VERSION = "0.5.9"
GEOMETRY_TTL_S = 600
HEADERS_TTL_S = 7 * 24 * 3600
# Reads config.json and the safetensors headers on the node (never the tensors); prints one JSON
# line. Given the stamp (size + mtime) of what it read before, it answers "unchanged" instead.
MODEL_PROBE = (Path(__file__).resolve().parent.parent / "remote" / "model_headers.py").read_bytes()


@dataclass(frozen=True)
class ModelFacts:
    """The model's geometry and checkpoint size, and where they came from (for the page)."""

    geometry: ModelGeometry | None
    weights_bytes: int | None
    source: str


def node_memory(node: Node) -> NodeMemory:
    """What the budget needs from the inventory: GPU sizes and use, RAM, MemAvailable, cgroup."""
    gpus = list(node.gpus.all())
    facts = node.facts or {}
    return NodeMemory(
        gpu_memory_bytes=tuple(g.memory_total_bytes for g in gpus),
        host_ram_bytes=node.host_ram_bytes,
        mem_available_bytes=node.mem_available_bytes,
        cgroup_limit_bytes=facts.get("cgroup_limit_bytes"),
        gpu_used_bytes=tuple(g.memory_used_bytes or 0 for g in gpus) or None,
        gpu_names=tuple(g.name for g in gpus) or None,
    )


def model_facts(node: Node, model_path: str, pasted_config: str = "") -> ModelFacts:
    """The geometry from a pasted config.json, else read on the node over SSH (cached 10 min)."""
    if pasted_config.strip():
        try:
            return ModelFacts(from_config(json.loads(pasted_config)), None, "pasted config.json")
        except RecursionError:
            return ModelFacts(None, None, "the pasted config.json is nested too deeply")
        except (ValueError, GeometryError) as exc:
            return ModelFacts(None, None, f"the pasted config.json is unusable: {str(exc)[:200]}")
    if not model_path or not node.host_key:
        return ModelFacts(None, None, "not read (the node's host key is not trusted yet)")
    key = "model:" + hashlib.sha256(f"{node.pk}:{node.host}:{model_path}".encode()).hexdigest()
    cached = cache.get(key)
    if cached is None:
        cached = _read_model(node, model_path)
        cache.set(key, cached, GEOMETRY_TTL_S if "config" in cached else 30)
    if "config" not in cached:
        return ModelFacts(None, None, cached["error"])
    try:
        geometry = from_config(cached["config"])
    except GeometryError as exc:
        return ModelFacts(None, cached["weights_bytes"], f"{model_path}/config.json: {exc}")
    tensors = cached.get("tensors")
    if isinstance(tensors, list):
        geometry = replace(geometry, tensors=tuple(tensors))
    else:  # the budget's weights line says so
        note = str(cached.get("headers_error") or "no safetensors headers")[:200]
        geometry = replace(geometry, headers_note=f"headers not read: {note}")
    return ModelFacts(geometry, cached["weights_bytes"], f"read from {node.name}:{model_path}")


def model_of(node: Node, args: list[str]) -> ModelFacts:
    """The geometry of the model ``args`` serve (their ``--model-path``), read on ``node``."""
    flags = parse_command(list(args), table(node.sglang_version or DEFAULT_VERSION))
    return model_facts(node, str(flags.get("model_path", default="") or ""))


def _read_model(node: Node, model_path: str) -> dict[str, object]:
    """The node's answer for the model folder; the headers are read again only when the
    folder's stamp (total size, newest mtime) changed since the last read (cached a week)."""
    key = "headers:" + hashlib.sha256(f"{node.pk}:{node.host}:{model_path}".encode()).hexdigest()
    before = cache.get(key)
    stamp = [str(before["stamp"])] if isinstance(before, dict) and before.get("stamp") else []
    try:
        with ssh.pool.session(target_for(node)) as client:
            result = ssh.run(
                client, ["python3", "-", model_path, *stamp], stdin=MODEL_PROBE, timeout=60
            )
        doc: dict[str, object] = json.loads(result.stdout)
        if doc.get("unchanged") and isinstance(before, dict):
            return before
        if "error" in doc:
            doc["error"] = f"not read from {node.name}: {doc['error']}"
        elif "config" in doc:
            cache.set(key, doc, HEADERS_TTL_S)
        return doc
    except ssh.RemoteError as exc:
        return {"error": f"not read from {node.name}: {exc.message}"}
    except ValueError:
        return {"error": f"not read from {node.name}: unexpected output"}


def evaluate(
    args: list[str],
    node: Node,
    model: ModelFacts,
    version: str | None = None,
    env: dict[str, str] | None = None,
    memory: NodeMemory | None = None,
) -> BudgetReport:
    """The budget of ``args`` (flags after the launcher) with ``env`` on ``node`` (its memory as
    last read, or ``memory``)."""
    from nodes.services import calibrations

    version = version or node.sglang_version or DEFAULT_VERSION
    flags = parse_command(args, table(version))
    flags.env = dict(env or {})
    memory = memory or node_memory(node)
    observed, _ = calibrations.observed_for(
        flags, memory.gpu_names or (), calibrations.used_now(memory, calibrations.ranks(flags))
    )
    return check(
        flags,
        memory,
        version=version,
        geometry=model.geometry,
        weights_bytes=model.weights_bytes,
        observed=observed,
    )


def save_revision(
    *,
    profile_name: str,
    args: list[str],
    env: dict[str, str],
    message: str,
    node: Node,
    report: BudgetReport,
    model: ModelFacts,
    actor: Actor,
    request: HttpRequest | None = None,
) -> ProfileRevision:
    """Create the profile if new, then its next revision; audit ``profile.revision``.

    Refuses (ValueError) a ``block`` verdict: such a profile cannot be saved.
    """
    if report.verdict == "block":
        raise ValueError("a blocked profile cannot be saved")
    author = actor.get_username() if actor.is_authenticated else "cli"
    with transaction.atomic():
        profile, _ = LaunchProfile.objects.get_or_create(
            name=profile_name, defaults={"created_by": author}
        )
        profile = LaunchProfile.objects.select_for_update().get(pk=profile.pk)
        last = profile.revisions.aggregate(Max("number"))["number__max"] or 0
        revision = ProfileRevision.objects.create(
            profile=profile,
            number=last + 1,
            args=args,
            env=env,
            message=message,
            author=author,
            node=node,
            sglang_version=node.sglang_version or DEFAULT_VERSION,
            verdict=report.verdict,
            report=report.to_json(),
            geometry_source=model.source,
        )
        record(
            "profile.revision",
            actor=actor,
            obj=profile,
            after={
                "revision": revision.number,
                "command": revision.command_line(),
                "message": message,
                "verdict": report.verdict,
                "node": node.name,
            },
            request=request,
        )
    return revision
