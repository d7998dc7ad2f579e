"""Profiles: list, one, validate flags against a node, save a revision, export, import."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Body, Router, Status
from ninja.errors import HttpError

from nodes.api.auth import OperatorAuth, require
from nodes.api.nodes import named
from nodes.api.pagination import Rows, paged
from nodes.api.schemas import (
    ERRORS,
    READ_ERRORS,
    BudgetOut,
    PlacementOut,
    ProfileOut,
    RevisionIn,
    ValidateIn,
)
from nodes.domain.budget import BudgetReport
from nodes.domain.exchange_document import ProfilesDocument
from nodes.models import LaunchProfile
from nodes.models.choices import Role
from nodes.services import exchange, model_facts, placement, profiles, teams
from nodes.services.roles import has_role
from nodes.services.teams import visible_profiles
from nodes.workflows import launching

router = Router(tags=["profiles"])


def profile_json(p: LaunchProfile) -> dict[str, Any]:
    doc = exchange.export([p.name])["profiles"][0]
    keys = ("name", "created_by", "team", "visibility", "revisions")
    return {"id": p.pk, **{k: doc[k] for k in keys}}


@router.get("", response={200: list[ProfileOut], **READ_ERRORS})
@paged
def list_profiles(request: HttpRequest) -> Any:
    """Profiles you may see, by name, one page at a time."""
    return Rows(visible_profiles(request.user).filter(adhoc=False), profile_json)


@router.get("/export", response={200: dict[str, Any], **READ_ERRORS})
def export_profiles(request: HttpRequest) -> Any:
    """Every profile you may see, with its revisions and known-good stamps
    (``rankwise-profiles/1``; secret values written as ``****``)."""
    names = list(visible_profiles(request.user).values_list("name", flat=True))
    return exchange.export(names)


def _inlined(node: Any, defs: dict[str, Any]) -> Any:
    """``node`` with each ``{"$ref": "#/$defs/X"}`` replaced by ``X`` (the models nest no loop)."""
    if isinstance(node, dict):
        ref = node.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return _inlined(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inlined(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inlined(v, defs) for v in node]
    return node


def _document_schema() -> dict[str, Any]:
    """The ``rankwise-profiles/1`` document's JSON Schema, whole, for the import's request body.
    The body is read as any JSON object and checked by the import itself, so a document that
    breaks the schema gets the import's own 400 and its words, not a generic 422."""
    schema = ProfilesDocument.model_json_schema()
    return {**_inlined(schema, schema.pop("$defs", {})), "additionalProperties": True}


@router.post(
    "/import",
    response={200: dict[str, list[str]], **ERRORS},
    auth=OperatorAuth(),
    openapi_extra={
        "requestBody": {
            "content": {"application/json": {"schema": _document_schema()}},
            "required": True,
        }
    },
)
def import_profiles(request: HttpRequest, doc: Body[dict[str, Any]]) -> Any:
    """An export brought in: every revision validated first; existing equal revisions are
    skipped, different ones reported as conflicts and left alone."""
    require(request, Role.OPERATOR)
    try:
        report = exchange.import_(
            doc,
            author=request.user.get_username(),
            writable=lambda p: teams.may_write(request.user, p),
            may_own=lambda t: teams.may_own(request.user, t),
            source="a document sent to the API",
        )
    except exchange.ImportRefused as exc:
        raise HttpError(400, str(exc)) from None
    exchange.audit_import(report, actor=request.user, request=request)
    return report.to_json()


@router.post("/validate", response={200: BudgetOut, **ERRORS})
def validate(request: HttpRequest, body: ValidateIn) -> Any:
    """The memory budget of ``args`` on ``node``, with its arithmetic; nothing is saved. The
    model is read on the node for an operator's token only (a viewer's budget goes without);
    when it was not read, a ``model-not-read`` message says why in the form's words ("no model
    folder at /x on gpu-01", "gpu-01 cannot be reached safely: …")."""
    operator = has_role(request.user, Role.OPERATOR)
    node = named(body.node)
    if problem := profiles.input_problem(node, body.args, body.env):
        raise HttpError(400, problem)
    model = model_facts.model_of(
        node, body.args, read_node=operator, wait=settings.RANKWISE_MODEL_READ_WAIT_SECONDS
    )
    doc = _budget(profiles.evaluate(body.args, node, model, env=body.env))
    if (said := model_facts.not_read(model)) is not None:
        doc["messages"].insert(0, said)
    return doc


@router.get("/{name}", response={200: ProfileOut, **READ_ERRORS})
def get_profile(request: HttpRequest, name: str) -> Any:
    if "\x00" in name:
        raise HttpError(404, "no such profile")
    return profile_json(get_object_or_404(visible_profiles(request.user), name=name, adhoc=False))


@router.get("/{name}/placement", response={200: PlacementOut, **READ_ERRORS})
def placement_of(request: HttpRequest, name: str, revision: int | None = None) -> Any:
    """Where profile ``name`` (its latest revision, or ``revision``; an ad-hoc one too) fits
    now: every node and GPU set, best first (``headroom_bytes``: host memory left after it),
    and why each other node does not; as ``manage.py place --json`` answers. The model is read
    on the nodes for an operator's token only."""
    if "\x00" in name or "@" in name:
        raise HttpError(404, "no such profile")
    if revision is not None and revision < 1:
        raise HttpError(422, f"revision must be a revision number (1 or more), not {revision}")
    spec = name if revision is None else f"{name}@{revision}"
    try:
        found = launching.resolve_profile(spec, request.user)
    except launching.LaunchInputError as exc:
        raise HttpError(404, str(exc)) from None
    wait = settings.RANKWISE_MODEL_READ_WAIT_SECONDS
    return placement.place(found, request.user, wait=wait).to_json()


def _budget(report: BudgetReport) -> dict[str, Any]:
    return {
        "verdict": report.verdict,
        "lines": report.lines,
        "messages": [{"level": m.level, "code": m.code, "text": m.text} for m in report.messages],
        "suggestion": report.suggestion,
        "suggestion_cost": report.suggestion_cost,
        "alternatives": report.alternatives,
    }


@router.post("/{name}/revisions", response={201: BudgetOut, **ERRORS}, auth=OperatorAuth())
def create_revision(request: HttpRequest, name: str, body: RevisionIn) -> Any:
    """Save the next revision of profile ``name`` (made if new) after checking it on ``node``:
    400 with the budget when it is blocked, or warns and ``acknowledge_warnings`` is false."""
    require(request, Role.OPERATOR)
    try:
        _, report, model = profiles.submit_revision(
            profile_name=name,
            node=named(body.node),
            args=body.args,
            env=body.env,
            message=body.message,
            actor=request.user,
            acknowledged=body.acknowledge_warnings,
            request=request,
            model_wait=settings.RANKWISE_MODEL_READ_WAIT_SECONDS,
        )
    except profiles.ProfileRefused as refused:
        if refused.kind == "missing":
            raise HttpError(404, "no such profile") from None
        raise HttpError(400, refused.reason) from None
    doc = _budget(report)
    if (said := model_facts.not_read(model)) is not None:
        doc["messages"].insert(0, said)
    return Status(201, doc)
