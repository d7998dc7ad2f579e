"""Launch profiles: check a profile against a node's memory and save it as a new revision.

``submit_revision`` is the one door for a new revision from the form, the API and the CLI: the
same input checks, the same budget, the same audit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import Max, Sum
from django.http import HttpRequest

from nodes.domain import env_policy, remedy
from nodes.domain import inventory as rules
from nodes.domain.budget import BudgetReport, NodeMemory, check
from nodes.domain.capacity import Checked
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import Commitment, LaunchProfile, Node, ProfileRevision
from nodes.services import calibrations, teams
from nodes.services.audit import record
from nodes.services.model_facts import ModelFacts, known_checkpoint_bytes, model_facts, model_of
from nodes.services.teams import visible_profiles
from nodes.types import Actor


class ProfileHidden(LookupError):
    """The profile is another team's own: to this caller it does not exist (answer 404)."""


MAX_ARGS, MAX_ARGS_CHARS = 2000, 65536  # as the API and an import bound them


class ProfileRefused(Exception):
    """Why a revision was not saved: ``kind`` is ``input`` (the name, a flag, a port or the
    environment is refused; the reason says which), ``exists`` (a new profile's name is
    taken), ``missing`` (another team's profile, which the actor cannot see), ``block`` (the
    budget blocks it on the node) or ``warn`` (its warnings were not acknowledged); ``report``
    is the budget when one was made."""

    def __init__(self, kind: str, reason: str, report: BudgetReport | None = None) -> None:
        super().__init__(reason)
        self.kind, self.reason, self.report = kind, reason, report


class ProfileExists(ValueError):
    """A profile that had to be new exists (made by another save meanwhile)."""


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


def node_memory(node: Node, only: list[int] | None = None) -> NodeMemory:
    """What the budget needs from the inventory: GPU sizes and use (of the GPUs indexed ``only``,
    or all), RAM, MemAvailable, cgroup."""
    gpus = [g for g in node.gpus.all() if only is None or g.index in only]
    facts = node.facts or {}
    return NodeMemory(
        gpu_memory_bytes=tuple(g.memory_total_bytes for g in gpus),
        host_ram_bytes=node.host_ram_bytes,
        mem_available_bytes=node.mem_available_bytes,
        cgroup_limit_bytes=facts.get("cgroup_limit_bytes"),
        gpu_used_bytes=tuple(g.memory_used_bytes or 0 for g in gpus) or None,
        gpu_names=tuple(g.name for g in gpus) or None,
    )


def node_memory_for(node: Node, profile_name: str | None, *, viewer: Actor | None) -> NodeMemory:
    """The node as a launch of the profile named ``profile_name`` would find it, which is what
    a revision of it is checked against: the memory its own launches there hold (their GPU
    processes, the host pools they pinned) counts as free, as once they are stopped to make way
    for it; what anything else holds stays used. ``node_memory`` for a new profile, and for a
    profile ``viewer`` may not see (another team's team-only one: naming it must not tell that
    it exists or what it holds); ``viewer`` None is the panel itself (a worker). Whether it
    could start now beside what runs is ``placement.on_node``'s question."""
    memory = node_memory(node)
    profiles = LaunchProfile.objects.all() if viewer is None else visible_profiles(viewer)
    own = set(
        Commitment.objects.filter(
            node=node,
            released__isnull=True,
            launch__revision__profile__in=profiles.filter(name=profile_name or ""),
        ).values_list("launch_id", flat=True)
    )
    if not profile_name or not own:
        return memory
    gpus = list(node.gpus.all())
    used = tuple(
        max(
            0,
            (g.memory_used_bytes or 0)
            - sum(
                int(p.get("used_memory_bytes") or 0)
                for p in g.processes or []
                if isinstance(p, dict) and p.get("launch_id") in own
            ),
        )
        for g in gpus
    )
    pinned = Commitment.objects.filter(launch_id__in=own, pinned=True).aggregate(
        total=Sum("host_bytes")
    )["total"]
    available = memory.mem_available_bytes
    if available is not None and pinned:
        available = min(available + pinned, node.host_ram_bytes or available + pinned)
    given_back = (available or 0) - (memory.mem_available_bytes or 0)
    return replace(
        memory,
        gpu_used_bytes=used or None,
        mem_available_bytes=available,
        own_pinned_bytes=given_back,
    )


def seen_profile(viewer: Actor, name: str | None) -> str | None:
    """``name`` when ``viewer`` may see a profile of that name (or none exists yet), else None:
    a check names its profile for the profile's own calibrations, and naming another team's
    hidden profile must not bring them in (nor tell that it exists)."""
    if not name:
        return None
    exists = LaunchProfile.objects.filter(name=name)
    if exists.exists() and not visible_profiles(viewer).filter(name=name).exists():
        return None
    return name


def node_as_inventoried(node: Node) -> NodeMemory:
    """The node a revision is judged against, as inventoried: its GPUs empty, and its host RAM
    as available as with no launch of the panel's running there (what they pinned counted back;
    what the node itself and anything else uses stays used). A revision's verdict is about the
    revision, not about whatever happens to run now: whether it could start now, beside what
    holds the GPUs, is ``placement.on_node``'s separate answer."""
    memory = node_memory(node)
    running = Commitment.objects.filter(node=node, released__isnull=True)
    pinned = running.filter(pinned=True).aggregate(total=Sum("host_bytes"))["total"]
    available = memory.mem_available_bytes
    if available is not None and pinned:
        available = min(available + pinned, node.host_ram_bytes or available + pinned)
    return replace(
        memory,
        gpu_used_bytes=tuple(0 for _ in memory.gpu_memory_bytes) or None,
        mem_available_bytes=available,
        own_pinned_bytes=(available or 0) - (memory.mem_available_bytes or 0),
        given_back_by="the panel's launches there",
    )


def evaluate(
    args: list[str],
    node: Node,
    model: ModelFacts,
    version: str | None = None,
    env: dict[str, str] | None = None,
    memory: NodeMemory | None = None,
    profile: str | None = None,
) -> BudgetReport:
    """The budget of ``args`` (flags after the launcher) with ``env`` on ``node`` (its memory as
    last read, or ``memory``), for the profile named ``profile`` (its own pasted calibrations
    apply; None: only the fleet's)."""
    version = version or node.sglang_version or DEFAULT_VERSION
    flags = parse_command(args, table(version))
    flags.env = dict(env or {})
    memory = memory or node_memory(node)
    observed, _ = calibrations.observed_for(
        flags,
        memory.gpu_names or (),
        calibrations.used_now(memory, calibrations.ranks(flags)),
        profile,
        # The checkpoint as read now, else as last read (stored figures are checked against it).
        lambda: (
            model.weights_bytes
            or known_checkpoint_bytes(node, str(flags.get("model_path", default="") or ""))
        ),
    )
    report = check(
        flags,
        memory,
        version=version,
        geometry=model.geometry,
        weights_bytes=model.weights_bytes,
        observed=observed,
    )
    if model.missing:
        report.add(
            "block",
            "model-missing",
            f"{model.missing[0].upper()}{model.missing[1:]}: SGLang cannot start from it. Correct "
            "--model-path, or copy the model to this node first.",
        )
    return report


def checker(
    args: list[str],
    node: Node,
    model: ModelFacts,
    *,
    env: dict[str, str],
    memory: NodeMemory,
    profile: str | None = None,
) -> Callable[[dict[str, Any]], Checked]:
    """A function from a ``change`` (as ``domain.remedy.with_changes`` takes it) to the budget of
    ``args`` with that change on ``node``: its verdict, device KV tokens per rank, warnings and,
    where computed, the host budget. A change the flags cannot take is ``block``."""
    flags = table(node.sglang_version or DEFAULT_VERSION)

    def check_change(change: dict[str, Any]) -> Checked:
        try:
            changed = remedy.with_changes(args, change, flags)
        except ValueError:
            return Checked("block", None)
        report = evaluate(changed, node, model, env=env, memory=memory, profile=profile)
        return Checked(
            report.verdict,
            report.device_kv_tokens_per_rank,
            tuple(m.text for m in report.messages if m.level == "warn"),
            host_budget_bytes=report.host_budget_bytes,
            ranks_per_node=report.ranks_per_node,
        )

    return check_change


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
    new_profile: bool = False,
) -> ProfileRevision:
    """Create the profile if new, then its next revision; audit ``profile.revision``. With
    ``new_profile`` the profile must not exist yet: ``ProfileExists`` (saving nothing) when
    another save made it meanwhile.

    Refuses (ValueError) a ``block`` verdict: such a profile cannot be saved. Raises
    ``ProfileHidden`` (saving nothing) when the profile exists and ``actor`` may not write to
    it (another team's own profile); and
    (``EnvRefused``, a ValueError) an environment the policy refuses on ``node``.
    """
    check_env(env, node)
    if report.verdict == "block":
        raise ValueError("a blocked profile cannot be saved")
    author = actor.get_username() if actor.is_authenticated else "cli"
    with transaction.atomic():
        profile, made = LaunchProfile.objects.get_or_create(
            name=profile_name, defaults={"created_by": author}
        )
        if not made and new_profile:
            raise ProfileExists(f"a profile named {profile_name!r} already exists")
        if not made and not teams.may_write(actor, profile):
            raise ProfileHidden(f"no profile named {profile_name!r}")
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
            geometry_source=model.source[:200],  # the column's width: a long reason is cut
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


def input_problem(node: Node, args: list[str], env: dict[str, str]) -> str | None:
    """Why ``args`` and ``env`` are refused before any budget, in one line: a flag or value the
    node's SGLang version refuses (an unknown flag, a port outside 1–65535…), a variable name
    no shell can set or the environment policy refuses on ``node``. ``None`` when usable."""
    if len(args) > MAX_ARGS or sum(map(len, args)) > MAX_ARGS_CHARS:
        return "the command is longer than a command line can be"
    version = node.sglang_version or DEFAULT_VERSION
    issues = parse_command(list(args), table(version)).issues
    refused = [i for i in issues if i.code in ("unknown", "invalid")]
    if refused:
        return f"SGLang {version} refuses it: {refused[0].message}"
    if problems := env_problems(env, node):  # the name rule and the environment policy
        return f"env: {'; '.join(problems)}"
    return None


class Submitted(NamedTuple):
    """A saved revision, its budget, and the model facts it was checked with."""

    revision: ProfileRevision
    report: BudgetReport
    model: ModelFacts


def submit_revision(
    *,
    profile_name: str,
    node: Node,
    args: list[str],
    env: dict[str, str],
    message: str,
    actor: Actor,
    acknowledged: bool,
    new_profile: bool = False,
    pasted_config: str = "",
    request: HttpRequest | None = None,
    model_wait: float | None = None,
) -> Submitted:
    """Check a revision and save it (form, API and CLI): the name, the input
    (``input_problem``), the profile's team (``actor`` must see it), then the budget on
    ``node``; a ``warn`` verdict is saved only when ``acknowledged``. ``new_profile`` refuses a
    name that exists. The model is read as ``model_facts`` reads it with ``wait=model_wait``.
    Returns the revision, its budget and the model facts; raises ``ProfileRefused``."""
    if problem := rules.check_node_name(profile_name):
        raise ProfileRefused("input", f"profile name: {problem}")
    existing = LaunchProfile.objects.filter(name=profile_name).first()
    if existing is not None and existing.adhoc:
        raise ProfileRefused("input", f"{profile_name} is an ad-hoc profile of a launch")
    hidden = existing is not None and not visible_profiles(actor).filter(pk=existing.pk).exists()
    if hidden and new_profile:
        # Another team's: "it exists" would tell that it does (an attacker's find).
        raise ProfileRefused("input", "profile name: that name cannot be used here; choose another")
    if existing is not None and new_profile:
        raise ProfileRefused("exists", f"a profile named {profile_name} exists")
    if hidden:
        raise ProfileRefused("missing", f"no profile named {profile_name!r}")  # another team's
    if problem := input_problem(node, args, env):
        raise ProfileRefused("input", problem)
    flags = parse_command(list(args), table(node.sglang_version or DEFAULT_VERSION))
    path = str(flags.get("model_path", default="") or "")
    model = model_facts(node, path, pasted_config, wait=model_wait)
    memory = node_as_inventoried(node)
    report = evaluate(list(args), node, model, env=env, memory=memory, profile=profile_name)
    if report.verdict == "block" or (report.verdict == "warn" and not acknowledged):
        why = "; ".join(m.text for m in report.messages if m.level in ("block", "warn"))
        raise ProfileRefused(report.verdict, f"{report.verdict}: {why}", report)
    try:
        revision = save_revision(
            profile_name=profile_name,
            args=list(args),
            env=dict(env),
            message=message,
            node=node,
            report=report,
            model=model,
            actor=actor,
            request=request,
        )
    except ProfileHidden as hidden:  # made team-only while it was checked
        raise ProfileRefused("missing", str(hidden)) from None
    return Submitted(revision, report, model)


class PromoteRefused(ValueError):
    """The ad-hoc revision cannot become a named profile: the name, or the budget, refuses."""


def promote(
    revision: ProfileRevision,
    name: str,
    *,
    actor: Actor,
    request: HttpRequest | None = None,
    wait: float | None = None,
) -> ProfileRevision:
    """Save an ad-hoc revision (a pasted command, or a fix applied to one) as revision 1 of a
    new named profile ``name``, re-validated on its node; audited like any revision. Raises
    ``PromoteRefused`` (nothing saved) for a name that is not valid or already taken, an
    environment the node's policy refuses, or a budget that blocks."""
    name = name.strip()
    if message := rules.check_node_name(name):
        raise PromoteRefused(message)
    if name.startswith("ad-hoc"):
        raise PromoteRefused("names starting with 'ad-hoc' are kept for pasted commands")
    if LaunchProfile.objects.filter(name=name).exists():
        raise PromoteRefused(f"a profile named {name!r} already exists: choose another name")
    node = revision.node
    if node is None:
        raise PromoteRefused("this revision names no node to check it on")
    args, env = list(revision.args), dict(revision.env or {})
    model = model_of(node, args, wait=wait)
    memory = node_as_inventoried(node)
    report = evaluate(args, node, model, env=env, memory=memory, profile=revision.profile.name)
    if report.verdict == "block":
        blocks = "; ".join(m.text.rstrip(".") for m in report.messages if m.level == "block")
        raise PromoteRefused(f"blocked on {node.name}: {blocks}")
    try:
        return save_revision(
            profile_name=name,
            args=args,
            env=env,
            message=f"From {revision} (ad-hoc)",
            node=node,
            report=report,
            model=model,
            actor=actor,
            request=request,
            new_profile=True,
        )
    except (ProfileExists, ProfileHidden):
        raise PromoteRefused(
            f"a profile named {name!r} was made meanwhile: choose another name"
        ) from None
    except ValueError as exc:
        raise PromoteRefused(str(exc).rstrip(".")) from None
