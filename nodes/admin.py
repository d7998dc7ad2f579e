"""Django admin for support use: nodes editable, the audit trail read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from nodes.models import AuditEntry, Gpu, LaunchProfile, Node, Team
from nodes.services.audit import record


class ViewOnly:
    """Support can look; changes go through the panel, where they are validated and audited."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdmin(ViewOnly, admin.ModelAdmin):  # type: ignore[type-arg]
    pass


class GpuInline(ViewOnly, admin.TabularInline[Gpu, Node]):
    model = Gpu
    extra = 0


class ReadOnlyUserAdmin(ReadOnlyAdmin, UserAdmin[User]):
    """Users are managed with ``manage.py user``, which audits every change."""


class ReadOnlyGroupAdmin(ReadOnlyAdmin, GroupAdmin):
    """The three role groups are fixed; membership changes through ``manage.py user``."""


admin.site.unregister(User)
admin.site.unregister(Group)
admin.site.register(User, ReadOnlyUserAdmin)
admin.site.register(Group, ReadOnlyGroupAdmin)


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ["name", "host", "port", "ssh_user", "status", "host_ram_bytes", "last_seen"]
    list_filter = ["status"]
    search_fields = ["name", "host"]
    inlines = [GpuInline]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ["time", "actor_name", "action", "object_repr", "request_id"]
    list_filter = ["action"]
    search_fields = ["actor_name", "object_repr", "request_id"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Admins make teams, choose their members and where their launch events go."""

    list_display = ("name", "webhook_url", "email")
    filter_horizontal = ("members",)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        team = form.instance
        record(
            "team.update" if change else "team.create",
            actor=request.user,
            obj=team,
            after={
                "name": team.name,
                "members": sorted(team.members.values_list("username", flat=True)),
                "webhook_url": team.webhook_url,
                "email": team.email,
            },
            request=request,
        )

    def delete_model(self, request: HttpRequest, obj: Team) -> None:
        self.delete_queryset(request, Team.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Team]) -> None:
        """Every deletion, one team's page or the list's bulk "delete selected", leaves one
        ``team.delete`` entry per team, written with the deletion (both or neither). The
        team's team-only profiles stay team-only with no team: admins alone see them until an admin
        gives them a team or shows them to everyone; each gets a ``profile.ownership`` entry
        and the admin a message naming them."""
        orphaned: list[str] = []
        with transaction.atomic():
            for team in queryset.prefetch_related("members"):
                kept = team.profiles.filter(visibility=LaunchProfile.Visibility.TEAM)
                for profile in kept:
                    # An entry about the profile: the audit list hides it from non-admins
                    # (the team's entry, which everyone reads, does not name its profiles).
                    record(
                        "profile.ownership",
                        actor=request.user,
                        obj=profile,
                        before={"team": team.name, "visibility": profile.visibility},
                        after={"team": None, "visibility": profile.visibility,
                               "seen_by": "admins only (its team was deleted)"},
                        request=request,
                    )  # fmt: skip
                    orphaned.append(profile.name)
                record(
                    "team.delete",
                    actor=request.user,
                    obj=team,
                    before={
                        "name": team.name,
                        "members": sorted(m.get_username() for m in team.members.all()),
                        "webhook_url": team.webhook_url,
                        "email": team.email,
                    },
                    request=request,
                )
            super().delete_queryset(request, queryset)
        if orphaned:
            self.message_user(
                request,
                f"Team-only profiles now seen by admins only: {', '.join(sorted(orphaned))}. "
                "Give them a team, or show them to everyone, on their pages.",
                messages.WARNING,
            )
