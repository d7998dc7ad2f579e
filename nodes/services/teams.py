"""Teams: who may see (and write) a profile and its launches, and telling a team what happened
to its launches.

A team-only profile, its revisions and launches (their pages, logs, bundles, live streams,
cleanups, audit entries) exist only for the team's members and admins: everyone else is
answered as if they did not exist (404). Node pages say only that GPUs are held by "a
team-only launch".

Events (``event`` in the JSON a team's webhook receives, also e-mailed when
``RANKWISE_NOTIFY_EMAIL_FROM`` is set): ``launch.ready``, ``launch.failed`` (with the diagnosis
summary), ``launch.lost``, ``gpu.quarantine``. Delivery runs on the workers (``nodes.notify``),
retried on network errors; a team without a webhook or e-mail is not told.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from django.db.models import CharField, Q, QuerySet
from django.db.models.functions import Cast

from nodes.domain.gpu_holders import Holder
from nodes.models import AuditEntry, Cleanup, Launch, LaunchProfile, Team
from nodes.models.choices import Role
from nodes.services.roles import has_role
from nodes.types import Actor

log = logging.getLogger(__name__)


def _visible(user: Actor, profile: str = "") -> Q | None:
    """The condition a row passes when ``user`` may see the profile at ``profile`` (a lookup
    path, "" for the profile itself); ``None`` when every row passes (an admin)."""
    if has_role(user, Role.ADMIN):
        return None
    # A subquery of the user's teams, not a join on the members: no row is counted twice.
    mine = (
        Team.objects.filter(members__pk=user.pk) if user.is_authenticated else Team.objects.none()
    )
    # A team-only profile whose team was deleted stays hidden: admins only, until an admin
    # gives it a team (or shows it to everyone) on its page.
    return Q(**{f"{profile}visibility": LaunchProfile.Visibility.EVERYONE}) | Q(
        **{f"{profile}team__in": mine}
    )


def visible_profiles(user: Actor) -> QuerySet[LaunchProfile]:
    """Profiles ``user`` may see: every one shown to everyone, and their teams' own; admins
    see all (a team-only profile whose team was deleted is seen by admins only). The same
    profiles are the ones ``user`` may write to (``may_write``)."""
    condition = _visible(user)
    profiles = LaunchProfile.objects.all()
    return profiles if condition is None else profiles.filter(condition)


def may_write(user: Actor, profile: LaunchProfile) -> bool:
    """Whether ``user`` may add revisions to ``profile`` (fix, revert, edit, import, API):
    whoever may see it. Callers answer 404 otherwise, as for a profile that does not exist."""
    return visible_profiles(user).filter(pk=profile.pk).exists()


def may_own(user: Actor, team: Team) -> bool:
    """Whether ``user`` may give a profile to ``team`` (its ownership form, an import): an
    admin, or a member of the team."""
    if has_role(user, Role.ADMIN):
        return True
    return user.pk is not None and team.members.filter(pk=user.pk).exists()


def visible_launches(user: Actor) -> QuerySet[Launch]:
    """Launches ``user`` may see: those of the profiles ``visible_profiles`` gives."""
    condition = _visible(user, "revision__profile__")
    launches = Launch.objects.all()
    return launches if condition is None else launches.filter(condition)


def hidden_launches(user: Actor) -> QuerySet[Launch]:
    """Launches of team-only profiles ``user`` is not a member of (none for an admin)."""
    condition = _visible(user, "revision__profile__")
    return Launch.objects.none() if condition is None else Launch.objects.exclude(condition)


def team_only_launches() -> QuerySet[Launch]:
    """Launches of team-only profiles: text anyone may read (another launch's pre-flight)
    does not name them."""
    return Launch.objects.filter(revision__profile__visibility=LaunchProfile.Visibility.TEAM)


def visible_cleanups(user: Actor) -> QuerySet[Cleanup]:
    """Cleanups ``user`` may see: those about no launch, or about a launch they may see."""
    return Cleanup.objects.exclude(launch__in=hidden_launches(user))


def visible_audit(user: Actor, entries: QuerySet[AuditEntry]) -> QuerySet[AuditEntry]:
    """``entries`` without those about what ``user`` may not see: a hidden launch or profile,
    or a node's cleanup of a hidden launch (its ``after`` names the launch)."""
    if _visible(user) is None:
        return entries
    launches = hidden_launches(user).annotate(key=Cast("pk", CharField())).values("key")
    profiles = (
        LaunchProfile.objects.exclude(pk__in=visible_profiles(user))
        .annotate(key=Cast("pk", CharField()))
        .values("key")
    )
    # Cleanups are few: the launches they name are listed, for a JSON lookup every database
    # compares the same way.
    cleaned = list(
        Cleanup.objects.filter(launch__in=hidden_launches(user)).values_list("launch_id", flat=True)
    )
    return entries.exclude(
        Q(object_type="launch", object_id__in=launches)
        | Q(object_type="launchprofile", object_id__in=profiles)
        | Q(action="node.cleanup", after__launch__in=cleaned)
    )


def mask_launch_ids(user: Actor, texts: list[str]) -> list[str]:
    """``texts`` with each ``launch #N`` of a launch hidden from ``user`` said as "a team-only
    launch" (node events name launches in words)."""
    named = {int(n) for text in texts for n in _LAUNCH_ID.findall(text)}
    if not named:
        return texts
    hidden = set(hidden_launches(user).filter(pk__in=named).values_list("pk", flat=True))
    return [
        _LAUNCH_ID.sub(lambda m: "a team-only launch" if int(m[1]) in hidden else m[0], text)
        for text in texts
    ]


def mask_holders(user: Actor, holders: Iterable[Holder]) -> None:
    """Make each GPU holder of a launch hidden from ``user`` say only that it is a team-only
    launch's: its launch id and command are dropped (in place)."""
    found = [h for h in holders if h.launch_id is not None]
    hidden = _hidden_among(user, {h.launch_id for h in found if h.launch_id is not None})
    for holder in found:
        if holder.launch_id in hidden:
            holder.launch_id, holder.command, holder.team_only = None, "", True


def mask_holder_json(user: Actor, gpus: list[dict[str, Any]]) -> None:
    """``mask_holders`` for GPU states as stored (a cleanup's result: ``[{"holders": [{"pid",
    "command", "launch_id", …}]}]``), in place."""
    found = [h for g in gpus for h in g.get("holders") or [] if isinstance(h, dict)]
    hidden = _hidden_among(
        user, {h["launch_id"] for h in found if isinstance(h.get("launch_id"), int)}
    )
    for holder in found:
        if holder.get("launch_id") in hidden:
            holder.update(launch_id=None, command="", team_only=True)


def _hidden_among(user: Actor, ids: set[int]) -> set[int]:
    if not ids:
        return set()
    return set(hidden_launches(user).filter(pk__in=ids).values_list("pk", flat=True))


# "launch #12", unless already said as "#12 (a team-only launch)" (a budget's neighbours).
_LAUNCH_ID = re.compile(r"launch #([0-9]{1,12})(?![0-9]| \(a team-only launch\))")
