"""Profiles: list, one, validate flags against a node, save a revision, export, import."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Body, Router, Status
from ninja.errors import HttpError

from nodes.api.auth import OperatorAuth, require
from nodes.api.nodes import named
from nodes.api.schemas import ERRORS, READ_ERRORS, BudgetOut, ProfileOut, RevisionIn, ValidateIn
from nodes.audit import record
from nodes.choices import Role
from nodes.domain import inventory as rules
from nodes.domain.budget import BudgetReport
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import table
from nodes.models import LaunchProfile, Node
from nodes.services import exchange, profiles
from nodes.services.teams import visible_profiles

router = Router(tags=["profiles"])


def profile_json(p: LaunchProfile) -> dict[str, Any]:
    doc = exchange.export([p.name])["profiles"][0]
    keys = ("name", "created_by", "team", "visibility", "revisions")
    return {"id": p.pk, **{k: doc[k] for k in keys}}


@router.get("", response={200: list[ProfileOut], **READ_ERRORS})
def list_profiles(request: HttpRequest) -> Any:
    return [profile_json(p) for p in visible_profiles(request.user).filter(adhoc=False)]


@router.get("/export", response={200: dict[str, Any], **READ_ERRORS})
def export_profiles(request: HttpRequest) -> Any:
    """Every profile you may see, with its revisions and known-good stamps
    (``rankwise-profiles/1``; secret values written as ``****``)."""
    names = list(visible_profiles(request.user).values_list("name", flat=True))
    return exchange.export(names)


@router.post("/import", response={200: dict[str, list[str]], **ERRORS}, auth=OperatorAuth())
def import_profiles(request: HttpRequest, doc: Body[dict[str, Any]]) -> Any:
    """An export brought in: every revision validated first; existing equal revisions are
    skipped, different ones reported as conflicts and left alone."""
    require(request, Role.OPERATOR)
    mine = visible_profiles(request.user)
    try:
        report = exchange.import_(
            doc,
            author=request.user.get_username(),
            writable=lambda p: mine.filter(pk=p.pk).exists(),
        )
    except exchange.ImportRefused as exc:
        raise HttpError(400, str(exc)) from None
    record("profile.import", actor=request.user, after=report.to_json(), request=request)
    return report.to_json()


@router.post("/validate", response={200: BudgetOut, **ERRORS})
def validate(request: HttpRequest, body: ValidateIn) -> Any:
    """The memory budget of ``args`` on ``node``, with its arithmetic; nothing is saved."""
    return _budget(_check(named(body.node), body.args, body.env))


@router.get("/{name}", response={200: ProfileOut, **READ_ERRORS})
def get_profile(request: HttpRequest, name: str) -> Any:
    if "\x00" in name:
        raise HttpError(404, "no such profile")
    return profile_json(get_object_or_404(visible_profiles(request.user), name=name, adhoc=False))


def _check(node: Node, args: list[str], env: dict[str, str]) -> BudgetReport:
    if problems := profiles.env_problems(env, node):  # the environment policy, as the form
        raise HttpError(400, f"env: {'; '.join(problems)}")
    version = table(node.sglang_version or profiles.DEFAULT_VERSION)
    flags = parse_command(args, version)
    refused = [i for i in flags.issues if i.code in ("unknown", "invalid")]
    if refused:
        raise HttpError(400, f"SGLang {version.version} refuses it: {refused[0].message}")
    model = profiles.model_facts(node, str(flags.get("model_path", default="") or ""))
    return profiles.evaluate(args, node, model, env=env)


def _budget(report: BudgetReport) -> dict[str, Any]:
    return {
        "verdict": report.verdict,
        "lines": report.lines,
        "messages": [{"level": m.level, "code": m.code, "text": m.text} for m in report.messages],
        "suggestion": report.suggestion,
    }


@router.post("/{name}/revisions", response={201: BudgetOut, **ERRORS}, auth=OperatorAuth())
def create_revision(request: HttpRequest, name: str, body: RevisionIn) -> Any:
    """Save the next revision of profile ``name`` (made if new) after checking it on ``node``:
    400 with the budget when it is blocked, or warns and ``acknowledge_warnings`` is false."""
    require(request, Role.OPERATOR)
    if problem := rules.check_node_name(name):
        raise HttpError(400, f"profile name: {problem}")
    existing = LaunchProfile.objects.filter(name=name).first()
    if existing is not None and existing.adhoc:
        raise HttpError(400, f"{name} is an ad-hoc profile of a launch")
    if existing is not None and not visible_profiles(request.user).filter(pk=existing.pk).exists():
        raise HttpError(404, "no such profile")  # a team's own profile: others cannot write to it
    node = named(body.node)
    report = _check(node, body.args, body.env)
    if report.verdict == "block" or (report.verdict == "warn" and not body.acknowledge_warnings):
        why = [m.text for m in report.messages if m.level in ("block", "warn")]
        raise HttpError(400, f"{report.verdict}: {'; '.join(why)}")
    model = profiles.model_of(node, body.args)
    profiles.save_revision(
        profile_name=name,
        args=body.args,
        env=body.env,
        message=body.message,
        node=node,
        report=report,
        model=model,
        actor=request.user,
        request=request,
    )
    return Status(201, _budget(report))
