"""Diagnoses of launches and of uploaded bundles, and the one-click fix a diagnosis suggests.

The engine is ``nodes.domain.diagnosis``; this module feeds it a launch's bundle, stores the
answer on the launch (``diagnosis``, ``diagnosis_category``) and turns the remedy into a new
profile revision, re-validated by the budget engine before it is saved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.http import HttpRequest

from nodes.domain import remedy
from nodes.domain.budget import BudgetReport
from nodes.domain.diagnosis import Diagnosis, diagnose
from nodes.domain.sglang_flags import parse_command, split_command
from nodes.flag_tables import table
from nodes.models import Launch, ProfileRevision
from nodes.services import bundles, profiles
from nodes.services.profiles import DEFAULT_VERSION

Actor = AbstractBaseUser | AnonymousUser


def diagnose_bundle(log_text: str, facts: dict[str, Any]) -> Diagnosis:
    """The diagnosis of a bundle (``launch.log`` text, ``facts.json``): the command's flags are
    read as the bundle's engine version parses them."""
    command = facts.get("command") or []
    try:
        argv, _ = split_command([str(w) for w in command] if isinstance(command, list) else [])
    except ValueError:
        argv = []
    version = str(facts.get("engine_version") or DEFAULT_VERSION)
    return diagnose(log_text, facts, parse_command(argv, table(version)).values)


def diagnose_launch(launch_id: int) -> Diagnosis | None:
    """Diagnose a failed launch from what the panel holds (log, facts, snapshots) and store the
    answer with the flag changes its remedy suggests. ``None`` if the launch did not fail."""
    launch = Launch.objects.select_related("node", "revision__profile").get(pk=launch_id)
    if launch.status != "failed":
        return None
    found = diagnose_bundle(bundles.launch_log_text(launch), bundles.facts_of(launch))
    doc = found.to_json()
    doc["changes"] = remedy.changes_for(found.category, found.numbers, _budget_suggestion(launch))
    Launch.objects.filter(pk=launch_id).update(diagnosis=doc, diagnosis_category=found.category)
    return found


def _budget_suggestion(launch: Launch) -> dict[str, Any] | None:
    """What the budget engine suggests for the command that ran, on the node it ran on (its
    largest fitting --hicache-size, the mem-fraction-static the weights need), if anything."""
    report = _evaluate(launch, list(launch.revision.args))
    return dict(report.suggestion) if report.suggestion else None


def _evaluate(launch: Launch, args: list[str]) -> BudgetReport:
    node = launch.node
    flags = parse_command(args, table(node.sglang_version or DEFAULT_VERSION))
    model = profiles.model_facts(node, str(flags.get("model_path", default="") or ""))
    return profiles.evaluate(args, node, model, env=dict(launch.revision.env or {}))


@dataclass(frozen=True)
class Fix:
    """The suggested change of a failed launch, as it would be saved: the flags after it and
    the budget's verdict on them at the launch's node."""

    changes: dict[str, Any]
    args: list[str]
    report: BudgetReport

    @property
    def text(self) -> str:
        return remedy.describe(self.changes)


class FixError(ValueError):
    """The fix cannot be applied: no flag change suggested, or the budget blocks it."""


def suggested_fix(launch: Launch) -> Fix | None:
    """The fix of ``launch``'s stored diagnosis checked against its node now, or ``None``."""
    changes = (launch.diagnosis or {}).get("changes") or {}
    if not changes:
        return None
    version = table(launch.node.sglang_version or DEFAULT_VERSION)
    try:
        args = remedy.with_changes(list(launch.revision.args), changes, version)
    except ValueError:
        return None
    return Fix(changes, args, _evaluate(launch, args))


def apply_fix(
    launch: Launch, *, actor: Actor, request: HttpRequest | None = None
) -> ProfileRevision:
    """Save the suggested fix as the profile's next revision (on the launch's node), after
    re-validating it. Raises ``FixError`` when there is nothing to apply or the budget blocks."""
    fix = suggested_fix(launch)
    if fix is None:
        raise FixError("this diagnosis suggests no flag change; see its remedy")
    if fix.report.verdict == "block":
        blocks = "; ".join(m.text for m in fix.report.messages if m.level == "block")
        raise FixError(f"the suggested change is still blocked on {launch.node.name}: {blocks}")
    node = launch.node
    flags = parse_command(fix.args, table(node.sglang_version or DEFAULT_VERSION))
    model = profiles.model_facts(node, str(flags.get("model_path", default="") or ""))
    category = (launch.diagnosis or {}).get("category", "")
    return profiles.save_revision(
        profile_name=launch.revision.profile.name,
        args=fix.args,
        env=dict(launch.revision.env or {}),
        message=f"Fix from launch #{launch.pk} ({category}): {fix.text}",
        node=node,
        report=fix.report,
        model=model,
        actor=actor,
        request=request,
    )
