"""The one-click fix a diagnosis suggests: its flag changes applied to the launch's revision and
re-validated by the budget engine against the node as it was before the launch, then saved as
the profile's next revision."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from django.http import HttpRequest

from nodes.domain import remedy
from nodes.domain.budget import BudgetReport
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import (
    Launch,
    ProfileRevision,
)
from nodes.models.choices import (
    LaunchStatus,
)
from nodes.services import model_facts, profiles
from nodes.types import Actor


def checked_change(
    launch: Launch, changes: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(change, check)``: ``changes`` made complete and checked against the launch's node as
    it was before the launch. Where the budget still blocks ``changes`` but suggests more (a
    smaller host pool that then needs a lower mem-fraction-static), the change takes that too.
    ``check`` is ``{"verdict", "blocks"}``; the change is ``{}`` where none passes (``check``
    then says what blocks ``changes``), and ``check`` is ``None`` with no ``changes``."""
    if not changes:
        return {}, None
    version = table(launch.node.sglang_version or DEFAULT_VERSION)
    tried = dict(changes)
    report: BudgetReport | None = None
    for _ in range(2):
        try:
            args = remedy.with_changes(list(launch.revision.args), tried, version)
        except ValueError as exc:
            return {}, {"verdict": "block", "blocks": [str(exc)], "tried": remedy.describe(tried)}
        report = _evaluate(launch, args)
        if report.verdict != "block" or not report.suggestion:
            break
        # The budget's suggestion is complete for the changed command (budget.check).
        tried = {**tried, **{k: remedy.plain(v) for k, v in report.suggestion.items()}}
    assert report is not None
    check = {
        "verdict": report.verdict,
        "blocks": [m.text for m in report.messages if m.level == "block"],
    }
    if report.verdict == "block":
        return {}, {**check, "tried": remedy.describe(tried)}
    return tried, check


def budget_suggestion(launch: Launch) -> dict[str, Any] | None:
    """What the budget engine suggests for the command that ran, on the node it ran on (its
    largest fitting --hicache-size, the mem-fraction-static the weights need), if anything."""
    report = _evaluate(launch, list(launch.revision.args))
    return dict(report.suggestion) if report.suggestion else None


def _evaluate(launch: Launch, args: list[str], wait: float | None = None) -> BudgetReport:
    """The budget of ``args`` on the launch's node as it was before the launch: what a failure
    left held (leaked GPU memory, pinned host pages) is not room the fix can count on. The
    model is read as ``model_facts`` reads it with ``wait``."""
    node = launch.node
    model = model_facts.model_of(node, args, wait=wait)
    memory = profiles.node_memory(node)
    first = (launch.memory_timeline or [{}])[0]
    before = {int(k): int(v) for k, v in (launch.gpu_used_before or {}).items()}
    indexes = list(node.gpus.values_list("index", flat=True))
    memory = replace(
        memory,
        mem_available_bytes=first.get("host_available_bytes") or memory.mem_available_bytes,
        gpu_used_bytes=tuple(
            before.get(i, used)
            for i, used in zip(indexes, memory.gpu_used_bytes or (0,) * len(indexes), strict=False)
        )
        or memory.gpu_used_bytes,
    )
    return profiles.evaluate(
        args,
        node,
        model,
        env=dict(launch.revision.env or {}),
        memory=memory,
        profile=launch.revision.profile.name,
    )


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


def stored(launch: Launch) -> dict[str, Any] | None:
    """The launch's stored diagnosis in the shape pages read (``category``, ``summary``,
    ``remedy``: text; ``secondary_categories``: texts; ``evidence``: ``{"text", "line",
    "source"}``; ``numbers``, ``changes``: objects), or ``None`` when it has none usable."""
    doc = launch.diagnosis
    if not isinstance(doc, dict) or not isinstance(doc.get("category"), str):
        return None
    evidence: list[Any] = doc["evidence"] if isinstance(doc.get("evidence"), list) else []
    return {
        "category": doc["category"],
        "secondary_categories": [
            str(c) for c in doc.get("secondary_categories") or [] if isinstance(c, str)
        ],
        "summary": str(doc.get("summary") or ""),
        "remedy": str(doc.get("remedy") or ""),
        "evidence": [
            {
                "text": str(e.get("text") or ""),
                "line": e["line"] if isinstance(e.get("line"), int) else None,
                "source": str(e.get("source") or "log"),
            }
            for e in evidence
            if isinstance(e, dict)
        ],
        "numbers": doc["numbers"] if isinstance(doc.get("numbers"), dict) else {},
        "changes": doc["changes"] if isinstance(doc.get("changes"), dict) else {},
        "fix_check": doc["fix_check"] if isinstance(doc.get("fix_check"), dict) else None,
    }


def blocked_by_budget(launch: Launch) -> bool:
    """Whether pre-flight blocked ``launch`` on its memory budget (its ``budget`` check
    failed and was not overridden)."""
    return launch.status == LaunchStatus.BLOCKED and any(
        isinstance(c, dict) and c.get("name") == "budget" and not c.get("passed")
        and not c.get("override")
        for c in launch.checks or []
    )  # fmt: skip


def blocked_fix(launch: Launch, *, wait: float | None = 0) -> dict[str, Any]:
    """The change that lifts a budget block: the budget's own suggestion for the command on
    the launch's node (complete: ``budget.check`` settles it), ``{}`` where it has none. The
    model is read as ``model_facts`` reads it with ``wait`` (0: a page, never waiting)."""
    if not blocked_by_budget(launch):
        return {}
    report = _evaluate(launch, list(launch.revision.args), wait)
    return {k: remedy.plain(v) for k, v in (report.suggestion or {}).items()}


def suggested_fix(launch: Launch, *, wait: float | None = None) -> Fix:
    """The fix of ``launch``'s stored diagnosis (a launch pre-flight blocked on its budget:
    the budget's suggestion), checked against its node now. Raises ``FixError`` when the
    launch did not fail, has no diagnosis or it suggests no flag change."""
    if blocked_by_budget(launch):
        changes = blocked_fix(launch, wait=wait)
        if not changes:
            raise FixError("the budget suggests no flag change that passes; edit the profile")
        return _fix_of(launch, changes, wait)
    if launch.status != LaunchStatus.FAILED:
        raise FixError(f"launch #{launch.pk} did not fail ({launch.status}); nothing to fix")
    doc = stored(launch)
    if doc is None:
        raise FixError(f"launch #{launch.pk} has no diagnosis yet")
    if not doc["changes"]:
        raise FixError("this diagnosis suggests no flag change; see its remedy")
    return _fix_of(launch, doc["changes"], wait)


def _fix_of(launch: Launch, changes: dict[str, Any], wait: float | None) -> Fix:
    version = table(launch.node.sglang_version or DEFAULT_VERSION)
    try:
        args = remedy.with_changes(list(launch.revision.args), changes, version)
    except ValueError as exc:
        raise FixError(f"the suggested change cannot be applied: {exc}") from None
    return Fix(changes, args, _evaluate(launch, args, wait))


def apply_fix(
    launch: Launch,
    *,
    actor: Actor,
    request: HttpRequest | None = None,
    wait: float | None = None,
) -> tuple[ProfileRevision, bool]:
    """Save the suggested fix as the profile's next revision (on the launch's node), after
    re-validating it; ``(revision, True)``. When the profile's latest revision already is the
    fix (a second click), ``(that revision, False)``. Raises ``FixError`` when there is nothing
    to apply or the budget blocks it. The model is read with ``wait`` (as ``model_facts``)."""
    fix = suggested_fix(launch, wait=wait)
    if fix.report.verdict == "block":
        blocks = "; ".join(m.text for m in fix.report.messages if m.level == "block")
        raise FixError(f"the suggested change is still blocked on {launch.node.name}: {blocks}")
    env = dict(launch.revision.env or {})
    latest = launch.revision.profile.latest()
    if latest is not None and list(latest.args) == fix.args and dict(latest.env or {}) == env:
        return latest, False
    node = launch.node
    model = model_facts.model_of(node, fix.args, wait=wait)
    category = (stored(launch) or {}).get("category") or (
        "budget" if blocked_by_budget(launch) else "diagnosis"
    )
    revision = profiles.save_revision(
        profile_name=launch.revision.profile.name,
        args=fix.args,
        env=env,
        message=f"Fix from launch #{launch.pk} ({category}): {fix.text}",
        node=node,
        report=fix.report,
        model=model,
        actor=actor,
        request=request,
    )
    return revision, True
