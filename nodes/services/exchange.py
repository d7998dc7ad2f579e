"""Profiles in and out of the panel as one JSON document (format ``rankwise-profiles/1``), for
Git and for moving between panels. docs/profiles.md ("Reusing profiles") documents it.

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

from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from nodes.domain.exchange_document import FORMAT as FORMAT  # the services' name for it
from nodes.domain.exchange_document import (
    DocumentRefused,
    ProfileEntry,
    RevisionEntry,
    read_document,
)
from nodes.domain.redact import MASK, mask_arg_values, redact_args, redact_env
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import DEFAULT_VERSION, table
from nodes.models import KnownGoodStamp, LaunchProfile, Node, ProfileRevision, Team
from nodes.services.audit import record
from nodes.services.profiles import env_problems
from nodes.types import Actor


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
                # Where an imported stamp came from goes with it: it stays imported.
                **({"imported_from": s.imported_from} if s.imported_at else {}),
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
    doc: Any,
    *,
    author: str,
    writable: Callable[[LaunchProfile], bool] | None = None,
    may_own: Callable[[Team], bool] | None = None,
    source: str = "a document",
) -> ImportReport:
    """Bring an export in; raises ``ImportRefused`` (and saves nothing) for a document or a
    revision that cannot be read, or when another import or save of the same revisions ran at
    the same moment. A profile already here that ``writable`` refuses (another team's, an
    ad-hoc one) is reported as a conflict and left alone; a new one owned by a team that
    ``may_own`` refuses (the importer is not a member) is not imported, and a note says so."""
    exported = doc.get("exported_at") if isinstance(doc, dict) else None
    origin = f"{source} imported by {author}" + (
        f" (exported {str(exported)[:40]})" if exported else ""
    )
    try:
        return _import(doc, author, writable, may_own, origin[:300])
    except IntegrityError:
        raise ImportRefused(
            "another import or save of these profiles ran at the same moment; nothing was "
            "imported: try again"
        ) from None


def _import(
    doc: Any,
    author: str,
    writable: Callable[[LaunchProfile], bool] | None,
    may_own: Callable[[Team], bool] | None,
    origin: str,
) -> ImportReport:
    nodes = {n.name: n for n in Node.objects.all()}
    profiles = _checked(doc, nodes)
    report = ImportReport()
    teams = {t.name: t for t in Team.objects.all()}
    missing_nodes: set[str] = set()
    with transaction.atomic():
        for p in profiles:
            team = teams.get(p.team or "")
            new = not LaunchProfile.objects.filter(name=p.name).exists()
            if new and team is not None and may_own is not None and not may_own(team):
                report.notes.append(
                    f"{p.name}: owned by team {team.name}, which you are not a member of; not "
                    "imported (a member of it or an admin can import it)"
                )
                continue
            # A team-only profile whose team is not here stays hidden: admins alone see it (as
            # when its team is deleted), never everyone: an import must not widen who reads it.
            visibility: str = p.visibility or LaunchProfile.Visibility.EVERYONE.value
            if p.team and team is None and visibility == LaunchProfile.Visibility.TEAM:
                report.notes.append(
                    f"{p.name}: team {p.team!r} is not here; the profile is team-only and seen by "
                    "admins alone until an admin gives it a team"
                )
            profile, made = LaunchProfile.objects.get_or_create(
                name=p.name,
                defaults={
                    "created_by": p.created_by or author,
                    "team": team,
                    "visibility": visibility,
                },
            )
            if not made and writable is not None and not writable(profile):
                # Another team's team-only profile: refused as any name taken is, without
                # saying that it is here or how its revisions compare.
                report.notes.append(
                    f"{p.name}: not imported: that name cannot be used here; rename the profile "
                    "in the document"
                )
                continue
            if not made and profile.adhoc:
                report.conflicts += [f"{profile.name}@{r.number}" for r in p.revisions]
                continue
            for r in p.revisions:
                label = f"{profile.name}@{r.number}"
                here = profile.revisions.filter(number=r.number).first()
                if here is not None:
                    # Secret values are compared as exported (``****``): a masked export of
                    # this panel's own profiles comes back "the same".
                    same = redact_args(list(here.args)) == redact_args(r.args) and redact_env(
                        dict(here.env)
                    ) == redact_env(r.env)
                    (report.skipped if same else report.conflicts).append(label)
                    continue
                if r.node and r.node not in nodes:
                    missing_nodes.add(r.node)
                masked = [k for k, v in r.env.items() if MASK in v] + [
                    a for a, b in zip(r.args, r.args[1:], strict=False) if MASK in b
                ]
                if masked:
                    report.notes.append(
                        f"{label}: {', '.join(masked)} came in masked (****): set the real "
                        "values in a new revision before launching it"
                    )
                _create(profile, r, nodes, author, origin)
                report.created.append(label)
    if missing_nodes:
        report.notes.append(
            f"nodes {', '.join(sorted(missing_nodes))} are not in this panel: the revisions and "
            "stamps keep their names but name no node here"
        )
    return report


def _create(
    profile: LaunchProfile, r: RevisionEntry, nodes: dict[str, Node], author: str, origin: str
) -> ProfileRevision:
    """Revision ``r`` of ``profile`` and its stamps, as the document has them; each stamp marked
    imported (from ``origin``, or from where the document says it came), never earned here."""
    revision = ProfileRevision.objects.create(
        profile=profile,
        number=r.number,
        args=list(r.args),
        env=dict(r.env),
        message=r.message or "",
        author=r.author or author,
        node=nodes.get(r.node or ""),
        sglang_version=r.sglang_version or "",
        verdict=r.verdict or "ok",
        report=r.report or {},
    )
    _keep_created(revision, r.created)
    for s in r.stamps or []:
        KnownGoodStamp.objects.create(
            revision=revision,
            node=nodes.get(s.node),
            node_name=s.node,
            gpu_name=s.gpu_name,
            gpu_count=s.gpu_count,
            gpu_memory_bytes=s.gpu_memory_bytes,
            host_ram_bytes=s.host_ram_bytes,
            sglang_version=s.sglang_version or "",
            launched_by=s.launched_by or "",
            stamped_at=_when(s.stamped_at) or timezone.now(),
            healthy_seconds=s.healthy_seconds or 0,
            observed=s.observed or {},
            estimate=s.estimate,
            imported_at=timezone.now(),
            imported_from=(s.imported_from or origin)[:300],
        )
    return revision


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


def _checked(doc: Any, nodes: dict[str, Node]) -> list[ProfileEntry]:
    """The document's profiles, every field checked by the format's models
    (``nodes.domain.exchange_document``), each revision's flags read by its version's parser
    and its environment by the policy of its node (the base policy when that node is not
    here); raises ``ImportRefused`` at the first problem."""
    try:
        document = read_document(doc)
    except DocumentRefused as refused:
        raise ImportRefused(str(refused)) from None
    for p in document.profiles:
        for r in p.revisions:
            _check_flags(f"{p.name}@{r.number}", r)
            if problems := env_problems(dict(r.env), nodes.get(r.node or "")):
                raise ImportRefused(f"{p.name}@{r.number}: {'; '.join(problems)}")
    return list(document.profiles)


def _check_flags(label: str, r: RevisionEntry) -> None:
    version = r.sglang_version or DEFAULT_VERSION
    try:
        flags = table(version)
    except (ValueError, KeyError):
        raise ImportRefused(f"{label}: {version!r} is not an SGLang version") from None
    parsed = parse_command(list(r.args), flags)
    refused = [i for i in parsed.issues if i.code in ("unknown", "invalid")]
    if refused:
        said = mask_arg_values(refused[0].message, r.args)
        raise ImportRefused(f"{label}: SGLang {version} refuses it: {said}")


def audit_import(report: ImportReport, *, actor: Actor, request: HttpRequest | None = None) -> None:
    """The audit trail of an import: how many revisions came in (names are not in it: a viewer
    sees every entry without an object), and one entry per profile that got revisions, on that
    profile (so its team's visibility applies)."""
    record(
        "profile.import",
        actor=actor,
        after={
            "created": len(report.created),
            "skipped": len(report.skipped),
            "conflicts": len(report.conflicts),
        },
        request=request,
    )
    by_profile: dict[str, list[str]] = {}
    for label in report.created:
        name, _, number = label.rpartition("@")
        by_profile.setdefault(name, []).append(f"@{number}")
    for profile in LaunchProfile.objects.filter(name__in=list(by_profile)):
        record(
            "profile.imported",
            actor=actor,
            obj=profile,
            after={"revisions": by_profile[profile.name]},
            request=request,
        )
