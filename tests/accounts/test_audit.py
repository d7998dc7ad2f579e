from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from nodes.models import AuditEntry
from tests.factories import PASSWORD, make_node

pytestmark = pytest.mark.django_db


def test_login_logout_and_failed_login_are_recorded(viewer):
    client = Client()
    client.post(reverse("login"), {"username": "vera", "password": "wrong"})
    client.post(reverse("login"), {"username": "vera", "password": PASSWORD})
    client.post(reverse("logout"))
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "actor_name"))
    assert actions == [
        ("auth.login_failed", "vera"),
        ("auth.login", "vera"),
        ("auth.logout", "vera"),
    ]
    failed = AuditEntry.objects.get(action="auth.login_failed")
    assert failed.actor is None and failed.request_id
    assert failed.after == {"address": "127.0.0.1"}  # where the attempt came from
    assert "wrong" not in str(failed.before) + str(failed.after)


def test_node_create_entry_carries_the_request_id_the_response_reports(admin_client_):
    from tests.factories import node_form_data

    response = admin_client_.post(reverse("nodes:node-create"), node_form_data())
    entry = AuditEntry.objects.get(action="node.create")
    assert entry.request_id == response["X-Request-ID"]
    assert entry.before is None and entry.after["host_ram_bytes"] == 449 * 10**9
    assert entry.object_repr == "gpu-01"


def test_audit_page_lists_entries_for_every_role(viewer_client):
    make_node()
    Client().post(reverse("login"), {"username": "vera", "password": PASSWORD})
    page = viewer_client.get(reverse("nodes:audit-list")).content.decode()
    assert "auth.login" in page and "vera" in page


def test_audit_entries_cannot_be_changed_even_by_a_superuser(admin_user):
    admin_user.is_staff = admin_user.is_superuser = True
    admin_user.save()
    client = Client()
    client.force_login(admin_user)
    entry = AuditEntry.objects.filter(action="auth.login").first()
    assert entry is not None
    url = reverse("admin:nodes_auditentry_change", args=[entry.pk])
    # The admin shows the entry read-only: no input fields for it, and a POST changes nothing.
    page = client.get(url).content.decode()
    assert 'name="action"' not in page
    client.post(url, {"action": "forged", "actor_name": "someone"})
    delete = client.post(reverse("admin:nodes_auditentry_delete", args=[entry.pk]), {"post": "yes"})
    assert delete.status_code == 403
    entry.refresh_from_db()
    assert entry.action == "auth.login" and entry.actor_name == "ada"


def test_the_trail_filters_by_action_actor_and_object_and_shows_before_after(viewer_client):
    from nodes.services.audit import record
    from tests.factories import make_user

    olga = make_user("olga", "operator")
    record("profile.revision", actor=olga, after={"revision": 2, "command": "--tp-size 8"})
    record("node.cleanup", actor=None, actor_name="cli", before={"gpus": [0]})
    page = viewer_client.get("/audit/", {"actor": "olga"}).content.decode()
    assert "profile.revision" in page and "node.cleanup" not in page
    assert "--tp-size 8" in page  # the after shown
    page = viewer_client.get("/audit/", {"actor": "'; drop", "action": "node."}).content.decode()
    assert "node.cleanup" in page and "profile.revision" not in page


def test_each_kind_of_change_lands_in_the_trail_with_its_before_and_after(
    admin_client_, admin_user
):
    """Node edits, profile revisions and ownership, launches with overridden checks, tokens:
    each one an entry naming who, what and the change."""
    from nodes.models import AuditEntry, LaunchProfile, Team
    from nodes.services import tokens
    from tests.factories import make_node, node_form_data

    node = make_node(
        "gpu-01",
        host="gpu-01.example.net",
        sglang_version="0.5.9",
        host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBdT4JxNkTy/+iculPU8JKSNDmkkoOmX7fwy4pE43/QY",
    )
    admin_client_.post(
        f"/nodes/{node.pk}/edit/",
        node_form_data(notes="moved to rack b", host="gpu-01.example.net"),
    )
    edit = AuditEntry.objects.filter(object_type="node", action__startswith="node.").latest("time")
    assert edit.before is not None and edit.after is not None and edit.before != edit.after

    bearer = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(admin_user, 'ci')}"}
    args = ["--model-path", "/m", "--tp-size", "2"]
    admin_client_.post(
        "/api/profiles/qwen/revisions", {"node": "gpu-01", "args": args, "message": "first"},
        content_type="application/json", **bearer,
    )  # fmt: skip
    revision = AuditEntry.objects.get(action="profile.revision")
    assert revision.after["revision"] == 1 and revision.after["message"] == "first"

    profile = LaunchProfile.objects.get(name="qwen")
    team = Team.objects.create(name="infra")
    admin_client_.post(
        f"/launch-profiles/{profile.pk}/ownership/", {"team": team.pk, "visibility": "team"}
    )
    owner = AuditEntry.objects.get(action="profile.ownership")
    assert owner.before["team"] is None and owner.after["team"] == "infra"

    admin_client_.post(
        "/api/launches",
        {"node": "gpu-01", "profile": "qwen@1", "overrides": {"budget": "known to fit"}},
        content_type="application/json",
        **bearer,
    )
    launch = AuditEntry.objects.get(action="launch.create")
    assert launch.actor_name == admin_user.username and launch.after
    assert AuditEntry.objects.filter(action="token.create").exists()
    assert all(e.actor_name for e in AuditEntry.objects.all())
