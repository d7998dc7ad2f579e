"""Profiles in and out of the panel as one JSON document (format ``rankwise-profiles/1``), for
Git and for moving between panels. README.md ("Profiles: export and import") documents it.

Export: every non-ad-hoc profile (or the named ones) with all its revisions and their
known-good stamps; secret values (``--api-key``, ``HF_TOKEN``…) are written as ``****`` unless
asked for. Import: every revision is read back with its SGLang version's parser first; nothing
is saved when one is refused. A revision number that exists with the same flags and
environment is skipped; with different ones it is a conflict, reported and not applied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from nodes.domain.env_policy import check_name
from nodes.domain.inventory import check_node_name
from nodes.domain.redact import MASK, redact_args, redact_env
from nodes.domain.sglang_flags import VERSION_TEXT, parse_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import KnownGoodStamp, LaunchProfile, Node, ProfileRevision, Team
from nodes.services.profiles import env_problems

FORMAT = "rankwise-profiles/1"


def export(names: list[str] | None = None, *, secrets: bool = False) -> dict[str, Any]:
    """``{"format", "exported_at", "profiles": [{"name", "created_by", "revisions": [{"number",
    "args", "env", "message", "author", "created", "node", "sglang_version", "verdict",
    "report", "stamps": [...]}]}]}``."""
    profiles = LaunchProfile.objects.filter(adhoc=False).prefetch_related(
        "revisions__stamps", "revisions__node"
    )
    if names is not None:
        profiles = profiles.filter(name__in=names)
    return {
        "format": FORMAT,
        "exported_at": timezone.now().isoformat(),
        "profiles": [
            {
                "name": p.name,
                "created_by": p.created_by,
                "team": p.team.name if p.team else None,
                "visibility": p.visibility,
                "revisions": [_revision(r, secrets) for r in p.revisions.order_by("number")],
            }
            for p in profiles.select_related("team")
        ],
    }


def _revision(r: ProfileRevision, secrets: bool) -> dict[str, Any]:
    return {
        "number": r.number,
        "args": list(r.args) if secrets else redact_args(list(r.args)),
        "env": dict(r.env) if secrets else redact_env(dict(r.env or {})),
        "message": r.message,
        "author": r.author,
        "created": r.created.isoformat(),
        "node": r.node.name if r.node else None,
        "sglang_version": r.sglang_version,
        "verdict": r.verdict,
        "report": r.report,
        "stamps": [
            {
                "node": s.node_name,
                "gpu_name": s.gpu_name,
                "gpu_count": s.gpu_count,
                "gpu_memory_bytes": s.gpu_memory_bytes,
                "host_ram_bytes": s.host_ram_bytes,
                "sglang_version": s.sglang_version,
                "launched_by": s.launched_by,
                "stamped_at": s.stamped_at.isoformat(),
                "healthy_seconds": s.healthy_seconds,
                "observed": s.observed,
                "estimate": s.estimate,
            }
            for s in r.stamps.all()
        ],
    }


class ImportRefused(ValueError):
    """The document is not a ``rankwise-profiles/1`` export, or a revision in it is refused."""


@dataclass
class ImportReport:
    created: list[str] = field(default_factory=list)  # "name@N"
    skipped: list[str] = field(default_factory=list)  # already here, the same
    conflicts: list[str] = field(default_factory=list)  # already here, different
    notes: list[str] = field(default_factory=list)  # what came in differently, in words

    def to_json(self) -> dict[str, list[str]]:
        return {
            "created": self.created,
            "skipped": self.skipped,
            "conflicts": self.conflicts,
            "notes": self.notes,
        }


def import_(
    doc: Any, *, author: str, writable: Callable[[LaunchProfile], bool] | None = None
) -> ImportReport:
    """Bring an export in; raises ``ImportRefused`` (and saves nothing) for a document or a
    revision that cannot be read. A profile already here that ``writable`` refuses (another
    team's, an ad-hoc one) is reported as a conflict and left alone."""
    nodes = {n.name: n for n in Node.objects.all()}
    profiles = _checked(doc, nodes)
    report = ImportReport()
    teams = {t.name: t for t in Team.objects.all()}
    missing_nodes: set[str] = set()
    with transaction.atomic():
        for p in profiles:
            team = teams.get(p.get("team") or "")
            if p.get("team") and team is None:
                report.notes.append(
                    f"{p['name']}: team {p['team']!r} is not here; the profile is visible to "
                    "everyone until an operator gives it a team"
                )
            visibility = p.get("visibility") if team is not None else "everyone"
            profile, made = LaunchProfile.objects.get_or_create(
                name=p["name"],
                defaults={
                    "created_by": p.get("created_by") or author,
                    "team": team,
                    "visibility": visibility
                    if visibility in LaunchProfile.Visibility.values
                    else "everyone",
                },
            )
            if not made and (profile.adhoc or (writable is not None and not writable(profile))):
                report.conflicts += [f"{profile.name}@{r['number']}" for r in p["revisions"]]
                continue
            for r in p["revisions"]:
                label = f"{profile.name}@{r['number']}"
                here = profile.revisions.filter(number=r["number"]).first()
                if here is not None:
                    # Secret values are compared as exported (``****``): a masked export of
                    # this panel's own profiles comes back "the same".
                    same = redact_args(list(here.args)) == redact_args(r["args"]) and redact_env(
                        dict(here.env)
                    ) == redact_env(r["env"])
                    (report.skipped if same else report.conflicts).append(label)
                    continue
                if r.get("node") and r["node"] not in nodes:
                    missing_nodes.add(r["node"])
                masked = [k for k, v in r["env"].items() if MASK in v] + [
                    a for a, b in zip(r["args"], r["args"][1:], strict=False) if MASK in b
                ]
                if masked:
                    report.notes.append(
                        f"{label}: {', '.join(masked)} came in masked (****): set the real "
                        "values in a new revision before launching it"
                    )
                revision = ProfileRevision.objects.create(
                    profile=profile,
                    number=r["number"],
                    args=r["args"],
                    env=r["env"],
                    message=r.get("message") or "",
                    author=r.get("author") or author,
                    node=nodes.get(r.get("node") or ""),
                    sglang_version=r.get("sglang_version") or "",
                    verdict=r.get("verdict") or "ok",
                    report=r.get("report") or {},
                )
                _keep_created(revision, r.get("created"))
                for s in r.get("stamps") or []:
                    KnownGoodStamp.objects.create(
                        revision=revision,
                        node=nodes.get(s["node"]),
                        node_name=s["node"],
                        gpu_name=s["gpu_name"],
                        gpu_count=s["gpu_count"],
                        gpu_memory_bytes=s["gpu_memory_bytes"],
                        host_ram_bytes=s.get("host_ram_bytes"),
                        sglang_version=s.get("sglang_version") or "",
                        launched_by=s.get("launched_by") or "",
                        stamped_at=_when(s.get("stamped_at")) or timezone.now(),
                        healthy_seconds=int(s.get("healthy_seconds") or 0),
                        observed=s.get("observed") or {},
                        estimate=s.get("estimate"),
                    )
                report.created.append(label)
    if missing_nodes:
        report.notes.append(
            f"nodes {', '.join(sorted(missing_nodes))} are not in this panel: the revisions and "
            "stamps keep their names but name no node here"
        )
    return report


def _keep_created(revision: ProfileRevision, text: Any) -> None:
    when = _when(text)
    if when is not None:
        ProfileRevision.objects.filter(pk=revision.pk).update(created=when)


def _when(text: Any) -> datetime | None:
    try:
        when = parse_datetime(text) if isinstance(text, str) else None
        if when is not None:
            when.timestamp()  # a date no database column holds raises here, not on save
        return when
    except (ValueError, OverflowError):
        return None


MAX_PROFILES, MAX_REVISIONS, MAX_STAMPS = 500, 2000, 100


def _checked(doc: Any, nodes: dict[str, Node]) -> list[dict[str, Any]]:
    """The document's profiles, every field checked as the pages check it, each revision's
    flags read by its version's parser and its environment by the policy of its node (the
    base policy when that node is not here); raises ``ImportRefused`` at the first problem."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ImportRefused(f"not a {FORMAT} document")
    profiles = doc.get("profiles")
    if not isinstance(profiles, list) or len(profiles) > MAX_PROFILES:
        raise ImportRefused(f"profiles must be a list of at most {MAX_PROFILES}")
    total = 0
    for p in profiles:
        if not isinstance(p, dict) or not isinstance(p.get("name"), str):
            raise ImportRefused("each profile needs a name")
        if problem := check_node_name(p["name"]):
            raise ImportRefused(f"{p['name'][:63]!r}: {problem}")
        _text(p, "created_by", p["name"], 150)
        _text(p, "team", p["name"], 63)
        if p.get("visibility") not in (None, *LaunchProfile.Visibility.values):
            raise ImportRefused(f"{p['name']}: visibility is everyone or team")
        if not isinstance(p.get("revisions"), list):
            raise ImportRefused(f"{p['name']}: revisions must be a list")
        total += len(p["revisions"])
        if total > MAX_REVISIONS:
            raise ImportRefused(f"at most {MAX_REVISIONS} revisions per document")
        for r in p["revisions"]:
            _check_revision(p["name"], r)
            if problems := env_problems(r["env"], nodes.get(r.get("node") or "")):
                raise ImportRefused(f"{p['name']}@{r['number']}: {'; '.join(problems)}")
    return profiles


def _text(doc: dict[str, Any], key: str, label: str, longest: int) -> None:
    value = doc.get(key)
    if value is not None and (not isinstance(value, str) or len(value) > longest):
        raise ImportRefused(f"{label}: {key} must be text of at most {longest} characters")


def _whole(doc: dict[str, Any], key: str, label: str, low: int, high: int) -> None:
    value = doc.get(key)
    if value is not None and (
        not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high
    ):
        raise ImportRefused(f"{label}: {key} must be a whole number from {low} to {high}")


def _check_revision(name: str, r: Any) -> None:
    if not isinstance(r, dict) or r.get("number") is None:
        raise ImportRefused(f"{name}: each revision needs a number of 1 or more")
    _whole(r, "number", name, 1, 10**6)
    label = f"{name}@{r['number']}"
    if not isinstance(r.get("args"), list) or not all(isinstance(a, str) for a in r["args"]):
        raise ImportRefused(f"{label}: args must be a list of strings")
    if len(r["args"]) > 2000 or sum(map(len, r["args"])) > 65536:
        raise ImportRefused(f"{label}: args are longer than a command line can be")
    env = r.setdefault("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ImportRefused(f"{label}: env must map variable names to strings")
    for key in env:
        if problem := check_name(key):
            raise ImportRefused(f"{label}: env: {problem}")
    for key, longest in (("message", 500), ("author", 150), ("node", 63), ("created", 40)):
        _text(r, key, label, longest)
    if r.get("verdict") not in (None, "ok", "warn", "block"):
        raise ImportRefused(f"{label}: verdict is ok, warn or block")
    if r.get("report") is not None and not isinstance(r["report"], dict):
        raise ImportRefused(f"{label}: report must be an object")
    version = r.get("sglang_version") or DEFAULT_VERSION
    if not isinstance(version, str) or not VERSION_TEXT.fullmatch(version):
        raise ImportRefused(f"{label}: {str(version)[:32]!r} is not an SGLang version")
    try:
        flags = table(version)
    except (ValueError, KeyError):
        raise ImportRefused(f"{label}: {version!r} is not an SGLang version") from None
    parsed = parse_command(list(r["args"]), flags)
    refused = [i for i in parsed.issues if i.code in ("unknown", "invalid")]
    if refused:
        raise ImportRefused(f"{label}: SGLang {version} refuses it: {refused[0].message}")
    stamps = r.get("stamps") or []
    if not isinstance(stamps, list) or len(stamps) > MAX_STAMPS:
        raise ImportRefused(f"{label}: stamps must be a list of at most {MAX_STAMPS}")
    for s in stamps:
        if not isinstance(s, dict) or not isinstance(s.get("node"), str):
            raise ImportRefused(f"{label}: a stamp needs node, gpu_name, gpu_count, memory")
        for key, longest in (("node", 63), ("gpu_name", 128), ("sglang_version", 32)):
            _text(s, key, label, longest)
        _text(s, "launched_by", label, 150)
        _text(s, "stamped_at", label, 40)
        if not isinstance(s.get("gpu_name"), str):
            raise ImportRefused(f"{label}: a stamp needs gpu_name")
        _whole(s, "gpu_count", label, 1, 64)
        _whole(s, "gpu_memory_bytes", label, 1, 2**50)
        _whole(s, "host_ram_bytes", label, 0, 2**55)
        _whole(s, "healthy_seconds", label, 0, 2**31 - 1)
        if s.get("gpu_count") is None or s.get("gpu_memory_bytes") is None:
            raise ImportRefused(f"{label}: a stamp needs gpu_count and gpu_memory_bytes")
        for key in ("observed", "estimate"):
            if s.get(key) is not None and not isinstance(s[key], dict):
                raise ImportRefused(f"{label}: a stamp's {key} must be an object")
