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
    from nodes.audit import record
    from tests.factories import make_user

    olga = make_user("olga", "operator")
    record("profile.revision", actor=olga, after={"revision": 2, "command": "--tp-size 8"})
    record("node.cleanup", actor=None, actor_name="cli", before={"gpus": [0]})
    page = viewer_client.get("/audit/", {"actor": "olga"}).content.decode()
    assert "profile.revision" in page and "node.cleanup" not in page
    assert "--tp-size 8" in page  # the after shown
    page = viewer_client.get("/audit/", {"actor": "'; drop", "action": "node."}).content.decode()
    assert "node.cleanup" in page and "profile.revision" not in page
