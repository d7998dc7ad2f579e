"""Profiles in and out of the panel as one JSON document (format ``rankwise-profiles/1``), for
Git and for moving between panels. README.md ("Profiles: export and import") documents it.

Export: every non-ad-hoc profile (or the named ones) with all its revisions and their
known-good stamps; secret values (``--api-key``, ``HF_TOKEN``…) are written as ``****`` unless
asked for. Import: every revision is read back with its SGLang version's parser first; nothing
is saved when one is refused. A revision number that exists with the same flags and
environment is skipped; with different ones it is a conflict, reported and not applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from nodes.domain.redact import MASK, redact_args, redact_env
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import table
from nodes.models import KnownGoodStamp, LaunchProfile, Node, ProfileRevision, Team
from nodes.services.profiles import DEFAULT_VERSION

FORMAT = "rankwise-profiles/1"


def export(names: list[str] | None = None, *, secrets: bool = False) -> dict[str, Any]:
    """``{"format", "exported_at", "profiles": [{"name", "created_by", "revisions": [{"number",
    "args", "env", "message", "author", "created", "node", "sglang_version", "verdict",
    "report", "stamps": [...]}]}]}``."""
    profiles = LaunchProfile.objects.filter(adhoc=False).prefetch_related(
        "revisions__stamps", "revisions__node"
    )
    if names:
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


def import_(doc: Any, *, author: str) -> ImportReport:
    """Bring an export in; raises ``ImportRefused`` (and saves nothing) for a document or a
    revision that cannot be read."""
    profiles = _checked(doc)
    report = ImportReport()
    nodes = {n.name: n for n in Node.objects.all()}
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
            for r in p["revisions"]:
                label = f"{profile.name}@{r['number']}"
                here = profile.revisions.filter(number=r["number"]).first()
                if here is not None:
                    same = list(here.args) == r["args"] and dict(here.env) == r["env"]
                    (report.skipped if same else report.conflicts).append(label)
                    continue
                if r.get("node") and r["node"] not in nodes:
                    missing_nodes.add(r["node"])
                masked = [k for k, v in r["env"].items() if v == MASK] + [
                    a for a, b in zip(r["args"], r["args"][1:], strict=False) if b == MASK
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
        return parse_datetime(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _checked(doc: Any) -> list[dict[str, Any]]:
    """The document's profiles, each revision's flags read by its version's parser."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ImportRefused(f"not a {FORMAT} document")
    profiles = doc.get("profiles")
    if not isinstance(profiles, list):
        raise ImportRefused("profiles must be a list")
    for p in profiles:
        if not isinstance(p, dict) or not isinstance(p.get("name"), str) or not p["name"]:
            raise ImportRefused("each profile needs a name")
        if len(p["name"]) > 63 or not isinstance(p.get("revisions"), list):
            raise ImportRefused(f"{p['name'][:63]}: a name of 63 characters at most, revisions")
        for r in p["revisions"]:
            _check_revision(p["name"], r)
    return profiles


def _check_revision(name: str, r: Any) -> None:
    if not isinstance(r, dict) or not isinstance(r.get("number"), int) or r["number"] < 1:
        raise ImportRefused(f"{name}: each revision needs a number of 1 or more")
    label = f"{name}@{r['number']}"
    if not isinstance(r.get("args"), list) or not all(isinstance(a, str) for a in r["args"]):
        raise ImportRefused(f"{label}: args must be a list of strings")
    env = r.setdefault("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ImportRefused(f"{label}: env must map names to strings")
    version = str(r.get("sglang_version") or DEFAULT_VERSION)
    try:
        flags = table(version[:32])
    except (ValueError, KeyError):
        raise ImportRefused(f"{label}: {version[:32]!r} is not an SGLang version") from None
    parsed = parse_command(list(r["args"]), flags)
    refused = [i for i in parsed.issues if i.code in ("unknown", "invalid")]
    if refused:
        raise ImportRefused(f"{label}: SGLang {version} refuses it: {refused[0].message}")
    for s in r.get("stamps") or []:
        if not isinstance(s, dict) or not all(
            isinstance(s.get(k), t)
            for k, t in (("node", str), ("gpu_name", str), ("gpu_count", int))
            + (("gpu_memory_bytes", int),)
        ):
            raise ImportRefused(f"{label}: a stamp needs node, gpu_name, gpu_count, memory")
