"""The ``rankwise-profiles/1`` document (profiles exported from a panel, imported into one) as
pydantic models: its shape, its limits, and, for a document that breaks them, one sentence
that says where and what (docs/profiles.md, "Reusing profiles").

``read_document(doc)`` → ``ProfilesDocument``, or ``DocumentRefused`` naming the first problem
in the document's order: ``"kimi@3: args must be a list of strings"``, ``"kimi@3: a stamp's
gpu_count must be a whole number from 1 to 64"``. Types are strict, as JSON gives them: a
number is no text, ``true`` no number. Keys the format does not name are ignored. What needs
the database or a version's flag table (the environment policy of a node, SGLang's parser) is
checked by the import itself (``nodes/services/exchange.py``).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from nodes.domain.env_policy import check_name
from nodes.domain.inventory import check_node_name
from nodes.domain.sglang_flags import VERSION_TEXT

FORMAT = "rankwise-profiles/1"
MAX_PROFILES, MAX_REVISIONS, MAX_STAMPS = 500, 2000, 100
#: A revision's flags: no more words, nor characters, than a command line holds.
MAX_ARGS, MAX_ARGS_CHARS = 2000, 65536


class DocumentRefused(ValueError):
    """The document is not a readable ``rankwise-profiles/1`` export; the message says why."""


def _refused(reason: str) -> PydanticCustomError:
    """An error whose message is ``reason`` itself (after the revision's label)."""
    return PydanticCustomError("refused", "{reason}", {"reason": reason})


def _text(longest: int) -> Any:
    return Field(max_length=longest, description=f"must be text of at most {longest} characters")


def _whole(low: int, high: int) -> Any:
    return Field(ge=low, le=high, description=f"must be a whole number from {low} to {high}")


OBJECT = "must be an object"


def _args(args: list[str]) -> list[str]:
    if len(args) > MAX_ARGS or sum(map(len, args)) > MAX_ARGS_CHARS:
        raise _refused("args are longer than a command line can be")
    return args


def _env(env: dict[str, str]) -> dict[str, str]:
    for key in env:
        if problem := check_name(key):
            raise _refused(f"env: {problem}")
    return env


def _sglang_version(value: Any) -> Any:
    """``None`` or ``""`` (the panel's default version) or a PEP 440 version's text."""
    if value is None or value == "":
        return value
    if not isinstance(value, str) or not VERSION_TEXT.fullmatch(value):
        raise _refused(f"{str(value)[:32]!r} is not an SGLang version")
    return value


def _profile_name(name: str) -> str:
    if problem := check_node_name(name):
        raise _refused(problem)
    return name


#: The largest whole number a JSON column stores and the pages print (PostgreSQL's bigint).
MAX_NUMBER = 2**63 - 1
SURROGATES = re.compile("[\ud800-\udfff]")


def _unstorable(value: Any) -> str | None:
    """What in ``value`` (its text, keys, numbers, anywhere inside) the database cannot store
    or the pages cannot print, in words; ``None`` when nothing. A loop, not recursion: JSON can
    nest deeper than Python's stack."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "holds a NUL character, which cannot be stored"
            if SURROGATES.search(item):
                return "holds a lone UTF-16 surrogate, which is not text"
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int):
            if abs(item) > MAX_NUMBER:
                return f"holds a number beyond ±{MAX_NUMBER:,}"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "holds NaN or Infinity, which JSON does not have"
        elif isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            pending += item
    return None


class _Entry(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    @field_validator("*")
    @classmethod
    def _storable(cls, value: Any, info: ValidationInfo) -> Any:
        """What PostgreSQL cannot store (NUL, lone surrogates, numbers past bigint, NaN) is
        refused here, not by a 500 at insert or later on a page."""
        if problem := _unstorable(value):
            raise _refused(f"{info.field_name} {problem}")
        return value


def _when(value: Any) -> Any:
    """``None`` or an ISO 8601 time a database column holds (years 1–9999 in UTC)."""
    if value is None:
        return value
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
        if when is not None and when.tzinfo is not None:
            when.astimezone(UTC)  # a time no column holds (year 1 at UTC+1) raises here
    except (ValueError, OverflowError, OSError):
        when = None
    if when is None:
        raise _refused(f"{str(value)[:40]!r} is not an ISO 8601 time a database holds")
    return value


def _report(value: Any) -> Any:
    """``None`` or the budget's report as saved: ``lines`` text, ``messages`` of ``level``,
    ``code`` and ``text``, each optional (the revision page shows them)."""
    if value is None:
        return value
    lines, messages = value.get("lines", []), value.get("messages", [])
    if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
        raise _refused("report's lines must be a list of strings")
    fields = ("level", "code", "text")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and all(isinstance(m.get(f, ""), str) for f in fields) for m in messages
    ):
        raise _refused("report's messages must be objects of level, code and text")
    return value


class StampEntry(_Entry):
    """A known-good stamp: a launch of the revision that stayed healthy on a node."""

    node: Annotated[str, _text(63)]
    gpu_name: Annotated[str, _text(128)]
    gpu_count: Annotated[int, _whole(1, 64)]
    gpu_memory_bytes: Annotated[int, _whole(1, 2**50)]
    host_ram_bytes: Annotated[int | None, _whole(0, 2**55)] = None
    sglang_version: Annotated[str | None, _text(32)] = None
    launched_by: Annotated[str | None, _text(150)] = None
    stamped_at: Annotated[str | None, _text(40), AfterValidator(_when)] = None
    healthy_seconds: Annotated[int | None, _whole(0, 2**31 - 1)] = None
    observed: Annotated[dict[str, Any] | None, Field(description=OBJECT)] = None
    estimate: Annotated[dict[str, Any] | None, Field(description=OBJECT)] = None
    #: Where a stamp that came in an earlier import was from (it stays imported).
    imported_from: Annotated[str | None, _text(300)] = None


class RevisionEntry(_Entry):
    """One saved revision of a profile: SGLang's flags and the environment, as saved."""

    number: Annotated[int, _whole(1, 10**6)]
    args: Annotated[
        list[str], Field(description="must be a list of strings"), AfterValidator(_args)
    ]
    env: Annotated[
        dict[str, str],
        Field(description="must map variable names to strings"),
        AfterValidator(_env),
    ] = {}
    message: Annotated[str | None, _text(500)] = None
    author: Annotated[str | None, _text(150)] = None
    node: Annotated[str | None, _text(63)] = None
    created: Annotated[str | None, _text(40), AfterValidator(_when)] = None
    verdict: Annotated[
        Literal["ok", "warn", "block"] | None, Field(description="is ok, warn or block")
    ] = None
    report: Annotated[dict[str, Any] | None, Field(description=OBJECT), AfterValidator(_report)] = (
        None
    )
    sglang_version: Annotated[
        str | None,
        Field(description="an SGLang version as pip reads it (0.5.9); empty or null: 0.5.9"),
        BeforeValidator(_sglang_version),
    ] = None
    stamps: Annotated[
        list[StampEntry] | None,
        Field(max_length=MAX_STAMPS, description=f"must be a list of at most {MAX_STAMPS}"),
    ] = None


class ProfileEntry(_Entry):
    """A launch profile with every revision it has."""

    name: Annotated[str, AfterValidator(_profile_name)]
    created_by: Annotated[str | None, _text(150)] = None
    team: Annotated[str | None, _text(63)] = None
    visibility: Annotated[
        Literal["everyone", "team"] | None, Field(description="is everyone or team")
    ] = None
    revisions: Annotated[list[RevisionEntry], Field(description="must be a list")]


class ProfilesDocument(_Entry):
    """``{"format": "rankwise-profiles/1", "profiles": [...]}``."""

    format: Literal["rankwise-profiles/1"]
    profiles: Annotated[
        list[ProfileEntry],
        Field(max_length=MAX_PROFILES, description=f"must be a list of at most {MAX_PROFILES}"),
    ]

    @model_validator(mode="before")
    @classmethod
    def _few_enough_revisions(cls, data: Any) -> Any:
        """Counted before anything else is read, so a huge document costs little."""
        profiles = data.get("profiles") if isinstance(data, dict) else None
        if isinstance(profiles, list):
            total = sum(
                len(p["revisions"])
                for p in profiles
                if isinstance(p, dict) and isinstance(p.get("revisions"), list)
            )
            if total > MAX_REVISIONS:
                raise _refused(f"at most {MAX_REVISIONS} revisions per document")
        return data


def read_document(doc: Any) -> ProfilesDocument:
    """``doc`` (parsed JSON) as a ``ProfilesDocument``; raises ``DocumentRefused`` with the first
    problem in words (``refusal``)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DocumentRefused(f"not a {FORMAT} document")
    try:
        return ProfilesDocument.model_validate(doc)
    except ValidationError as invalid:
        raise DocumentRefused(refusal(invalid.errors()[0], doc)) from None


def refusal(error: ErrorDetails, doc: dict[str, Any]) -> str:
    """One pydantic error of ``doc`` as the sentence a user reads: where (the profile's name,
    ``name@N`` for a revision) and what is wrong (the field's rule)."""
    loc, refused = error["loc"], error["type"] == "refused"
    if len(loc) < 2 or loc[0] != "profiles":
        if refused:
            return _reason(error)
        if loc and loc[0] == "profiles":
            return f"profiles {_rule(ProfilesDocument, 'profiles')}"
        return f"not a {FORMAT} document"
    profile = doc["profiles"][int(loc[1])]
    if len(loc) == 2 or loc[2] == "name":
        return f"{str(profile['name'])[:63]!r}: {_reason(error)}" if refused else NAMELESS
    name = profile["name"]
    if loc[2] != "revisions" or len(loc) == 3:
        return f"{name}: {_reason(error) if refused else _field_rule(ProfileEntry, loc[2])}"
    revision = profile["revisions"][int(loc[3])]
    if len(loc) == 4 or loc[4] == "number":
        if len(loc) == 4 or error["type"] == "missing":
            return f"{name}: each revision needs a number of 1 or more"
        return f"{name}: {_field_rule(RevisionEntry, 'number')}"
    label = f"{name}@{revision['number']}"
    return f"{label}: {_revision_problem(error, loc[4:])}"


NAMELESS = "each profile needs a name"


def _revision_problem(error: ErrorDetails, loc: tuple[int | str, ...]) -> str:
    refused = error["type"] == "refused"
    if loc[0] != "stamps" or len(loc) == 1:
        return _reason(error) if refused else _field_rule(RevisionEntry, loc[0])
    if len(loc) == 2:
        return "a stamp needs node, gpu_name, gpu_count, gpu_memory_bytes"
    if error["type"] == "missing":
        return f"a stamp needs {loc[2]}"
    return f"a stamp's {_reason(error) if refused else _field_rule(StampEntry, loc[2])}"


def _field_rule(model: type[BaseModel], field: int | str) -> str:
    return f"{field} {_rule(model, str(field))}"


def _reason(error: ErrorDetails) -> str:
    return str((error.get("ctx") or {}).get("reason") or error["msg"])


def _rule(model: type[BaseModel], field: str) -> str:
    info = model.model_fields.get(field)
    return (info.description if info is not None else None) or "is not readable"
