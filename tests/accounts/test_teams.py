"""Teams: profiles visible to their team only when so set, ownership changes audited, and a
team's webhook told when its launches become ready and fail (with the diagnosis summary)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, cast

import pytest
from django.urls import reverse

from nodes.models import AuditEntry, LaunchProfile, ProfileRevision, Team
from nodes.models.choices import LaunchStatus
from nodes.services import notifications, tokens
from nodes.services.model_facts import model_facts
from nodes.services.profiles import evaluate, save_revision
from nodes.workflows import launching
from tests.factories import make_node, make_user
from tests.fleet import wait_until
from tests.launching import node_fixture, wait_for

spare = node_fixture("spare")


class Hook:
    """A webhook receiver on 127.0.0.1: the JSON bodies it was POSTed."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 — http.server's name
                length = int(self.headers["Content-Length"])
                outer.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def events(self) -> list[str]:
        return [b["event"] for b in self.bodies]


@pytest.fixture
def hook():
    receiver = Hook()
    yield receiver
    receiver.server.shutdown()


@pytest.mark.django_db
def test_a_team_only_profile_is_hidden_from_others_on_pages_and_the_api(client):
    team = Team.objects.create(name="infra")
    member, outsider = make_user("mia", "viewer"), make_user("otto", "viewer")
    team.members.add(member.pk)
    node = make_node("gpu-01")
    secret = LaunchProfile.objects.create(
        name="secret", created_by="mia", team=team, visibility="team"
    )
    ProfileRevision.objects.create(
        profile=secret, number=1, args=["--model-path", "/m"], env={}, author="mia", node=node,
        verdict="ok", report={},
    )  # fmt: skip
    LaunchProfile.objects.create(name="shared", created_by="mia", team=team)
    client.force_login(outsider)
    page = client.get(reverse("nodes:profile-list")).content.decode()
    assert "shared" in page and "secret" not in page
    assert client.get(reverse("nodes:profile-detail", args=[secret.pk])).status_code == 404
    token = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(outsider, 't')}"}
    assert [p["name"] for p in client.get("/api/profiles", **token).json()["items"]] == ["shared"]
    assert client.get("/api/profiles/secret", **token).status_code == 404
    exported = client.get("/api/profiles/export", **token).json()
    assert [p["name"] for p in exported["profiles"]] == ["shared"]
    # Nor can an outsider launch it, from the form or the API.
    make = make_user("oscar", "operator")
    client.force_login(make)
    rev = secret.revisions.get()
    cloned = client.get(reverse("nodes:profile-create"), {"clone": rev.pk, "node": node.pk})
    assert cloned.status_code == 200 and "Cloned from secret" not in cloned.content.decode()
    form = client.get(reverse("nodes:launch-create")).content.decode()
    assert "secret@1" not in form
    op_token = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(make, 't')}"}
    refused = client.post(
        "/api/launches", {"node": "gpu-01", "profile": "secret@1"},
        content_type="application/json", **op_token,
    )  # fmt: skip
    assert refused.status_code == 400 and "no profile named 'secret'" in refused.json()["detail"]
    client.force_login(member)
    assert client.get(reverse("nodes:profile-detail", args=[secret.pk])).status_code == 200
    client.force_login(make_user("ada", "admin"))
    assert "secret" in client.get(reverse("nodes:profile-list")).content.decode()


@pytest.mark.django_db
def test_ownership_changes_are_audited_and_team_only_needs_a_team(operator_client, operator):
    team = Team.objects.create(name="infra")
    profile = LaunchProfile.objects.create(name="kimi", created_by="pat")
    url = reverse("nodes:profile-ownership", args=[profile.pk])
    refused = operator_client.post(url, {"team": "", "visibility": "team"}, follow=True)
    assert "Only a profile owned by a team" in refused.content.decode()
    outsider = operator_client.post(url, {"team": team.pk, "visibility": "team"}, follow=True)
    assert "Only members of the teams involved" in outsider.content.decode()
    profile.refresh_from_db()
    assert profile.team is None  # the operator is not in infra
    team.members.add(operator.pk)
    operator_client.post(url, {"team": team.pk, "visibility": "team"})
    profile.refresh_from_db()
    assert profile.team == team and profile.visibility == "team"
    entry = AuditEntry.objects.get(action="profile.ownership")
    assert entry.before == {"team": None, "visibility": "everyone"}
    assert entry.after == {"team": "infra", "visibility": "team"}


@pytest.mark.django_db
def test_delivery_posts_the_event_as_json_with_the_team(hook):
    team = Team.objects.create(name="infra", webhook_url=hook.url)
    notifications.deliver(team.pk, {"event": "gpu.quarantine", "node": "gpu-01", "detail": "GPU 0"})
    assert hook.bodies == [
        {"event": "gpu.quarantine", "node": "gpu-01", "detail": "GPU 0", "team": "infra"}
    ]


@pytest.mark.django_db(transaction=True)
def test_the_team_hears_of_ready_then_failed_with_the_diagnosis(spare, hook, launch_workers):
    olga = make_user("olga", "operator")
    team = Team.objects.create(name="infra", webhook_url=hook.url)
    args = ["--model-path", "/srv/models/qwen2.5-7b", "--tp-size", "2"]
    model = model_facts(spare, "/srv/models/qwen2.5-7b")
    revision = save_revision(
        profile_name="qwen", args=args, env={}, message="", node=spare,
        report=evaluate(args, spare, model), model=model, actor=olga,
    )  # fmt: skip
    LaunchProfile.objects.filter(pk=revision.profile_id).update(team=team)
    launch = launching.submit(node=spare, revision=revision, actor=olga)
    assert wait_for(launch, LaunchStatus.READY, LaunchStatus.FAILED) == "ready"
    assert wait_until(lambda: "launch.ready" in hook.events(), 20)
    spare.sim.ok("pkill -KILL -f '^sglang::scheduler_TP1'")
    assert wait_for(launch, LaunchStatus.FAILED, timeout=60) == "failed"
    assert wait_until(lambda: "launch.failed" in hook.events(), 30), hook.bodies
    failed = next(b for b in hook.bodies if b["event"] == "launch.failed")
    assert failed["launch"] == launch.pk and failed["team"] == "infra"
    assert failed["detail"].startswith("health-check-failure: the server was ready")


@pytest.mark.django_db
def test_every_way_the_admin_deletes_teams_is_audited(admin_user):
    from django.test import Client

    admin_user.is_staff = admin_user.is_superuser = True  # the support admin's first account
    admin_user.save()
    client = Client()
    client.force_login(admin_user)
    kept = Team.objects.create(name="keep")
    gone = [Team.objects.create(name=n) for n in ("infra", "research")]
    gone[0].members.add(admin_user.pk)
    # The list's bulk action "Delete selected teams", confirmed.
    client.post(
        reverse("admin:nodes_team_changelist"),
        {"action": "delete_selected", "_selected_action": [t.pk for t in gone], "post": "yes"},
    )
    assert list(Team.objects.values_list("name", flat=True)) == ["keep"]
    entries = AuditEntry.objects.filter(action="team.delete").order_by("object_repr")
    assert [(e.object_repr, e.actor_name) for e in entries] == [
        ("infra", admin_user.username),
        ("research", admin_user.username),
    ]
    assert entries[0].before["members"] == [admin_user.username]
    # One team's own delete page.
    client.post(reverse("admin:nodes_team_delete", args=[kept.pk]), {"post": "yes"})
    assert not Team.objects.exists()
    assert AuditEntry.objects.filter(action="team.delete", object_repr="keep").count() == 1


@pytest.mark.django_db
def test_deleting_a_team_leaves_its_team_only_profiles_to_admins_only(admin_user):
    """The adversarial sequence: team eps owns a team-only profile; the admin deletes the team
    with the bulk action; an outsider still gets 404 (page, API), the admin still sees it, and
    the audit says what became of it without naming it to others."""
    from django.test import Client

    admin_user.is_staff = admin_user.is_superuser = True
    admin_user.save()
    eps = Team.objects.create(name="eps")
    node = make_node("gpu-01")
    secret = LaunchProfile.objects.create(
        name="eps-secret", created_by="admin", team=eps, visibility="team"
    )
    ProfileRevision.objects.create(
        profile=secret, number=1, args=["--model-path", "/m"], env={"SOME": "1"}, author="admin",
        node=node, verdict="ok", report={},
    )  # fmt: skip
    admin = Client()
    admin.force_login(admin_user)
    answer = admin.post(
        reverse("admin:nodes_team_changelist"),
        {"action": "delete_selected", "_selected_action": [eps.pk], "post": "yes"},
        follow=True,
    )
    assert not Team.objects.exists()
    assert "now seen by admins only: eps-secret" in answer.content.decode()
    entry = AuditEntry.objects.get(action="profile.ownership", object_id=str(secret.pk))
    assert entry.before["team"] == "eps" and entry.after["team"] is None
    assert entry.actor_name == admin_user.username

    op2 = make_user("op2", "operator")
    outsider = Client()
    outsider.force_login(cast(Any, op2))
    assert outsider.get(reverse("nodes:profile-detail", args=[secret.pk])).status_code == 404
    token: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {tokens.create(op2, 't')}"}
    assert outsider.get("/api/profiles/eps-secret", **token).status_code == 404
    assert "eps-secret" not in outsider.get(reverse("nodes:audit-list")).content.decode()
    assert admin.get(reverse("nodes:profile-detail", args=[secret.pk])).status_code == 200
