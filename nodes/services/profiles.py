"""Launch profiles: check a profile against a node's memory and save it as a new revision."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.cache import cache
from django.db import transaction
from django.db.models import Max
from django.http import HttpRequest

from nodes import ssh
from nodes.audit import record
from nodes.domain import env_policy
from nodes.domain.budget import BudgetReport, NodeMemory, check
from nodes.domain.geometry import GeometryError, ModelGeometry, from_config
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import table
from nodes.models import LaunchProfile, Node, ProfileRevision
from nodes.services.credentials import target_for

Actor = AbstractBaseUser | AnonymousUser
DEFAULT_VERSION = "0.5.9"
GEOMETRY_TTL_S = 600
# Reads config.json and sums the checkpoint files on the node; prints one JSON line.
MODEL_PROBE = b"""
import json, os, sys
path = sys.argv[1]
with open(os.path.join(path, "config.json")) as handle:
    config = json.load(handle)
weights = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
              if n.endswith((".safetensors", ".bin", ".pt")))
print(json.dumps({"config": config, "weights_bytes": weights}))
"""


class EnvRefused(ValueError):
    """The environment policy refuses a variable on the node; the message names each one."""


def env_problems(env: dict[str, str], node: Node | None) -> list[str]:
    """Why the environment policy refuses ``env`` on ``node`` (its admin allowances counted),
    one message per variable; empty when it may run there. Every door that saves or launches
    a profile asks this: the form, the API, the import, ``save_revision`` and the launch."""
    allowances = list(node.allowed_env or []) if node is not None else []
    return env_policy.refusals(env, allowances, node.name if node is not None else "")


def check_env(env: dict[str, str], node: Node | None) -> None:
    """Raise ``EnvRefused`` naming every variable the policy refuses on ``node``."""
    if problems := env_problems(env, node):
        raise EnvRefused("; ".join(problems))


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
    return ModelFacts(geometry, cached["weights_bytes"], f"read from {node.name}:{model_path}")


def model_of(node: Node, args: list[str]) -> ModelFacts:
    """The geometry of the model ``args`` serve (their ``--model-path``), read on ``node``."""
    flags = parse_command(list(args), table(node.sglang_version or DEFAULT_VERSION))
    return model_facts(node, str(flags.get("model_path", default="") or ""))


def _read_model(node: Node, model_path: str) -> dict[str, object]:
    try:
        with ssh.pool.session(target_for(node)) as client:
            result = ssh.run(client, ["python3", "-", model_path], stdin=MODEL_PROBE, timeout=20)
        doc: dict[str, object] = json.loads(result.stdout)
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
    version = version or node.sglang_version or DEFAULT_VERSION
    flags = parse_command(args, table(version))
    flags.env = dict(env or {})
    return check(
        flags,
        memory or node_memory(node),
        version=version,
        geometry=model.geometry,
        weights_bytes=model.weights_bytes,
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

    Refuses (ValueError) a ``block`` verdict: such a profile cannot be saved; and
    (``EnvRefused``, a ValueError) an environment the policy refuses on ``node``.
    """
    check_env(env, node)
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
