"""Export and import in the panel: who may, what a viewer's export holds, refusals."""

from __future__ import annotations

import html
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from nodes.models import AuditEntry, LaunchProfile, ProfileRevision, Team
from tests.factories import make_node

pytestmark = pytest.mark.django_db


def _profile(name: str, **fields) -> LaunchProfile:
    node = make_node(f"n-{name}", sglang_version="0.5.9")
    profile = LaunchProfile.objects.create(name=name, created_by="pat", **fields)
    ProfileRevision.objects.create(
        profile=profile, number=1, args=["--model-path", "/m", "--api-key", "sk-secret"],
        env={}, author="pat", node=node, verdict="ok", report={},
    )  # fmt: skip
    return profile


def test_a_viewers_export_holds_what_they_see_with_secrets_masked(viewer_client):
    _profile("open")
    _profile("hidden", team=Team.objects.create(name="research"), visibility="team")
    response = viewer_client.get(reverse("nodes:profiles-export"))
    assert response["Content-Disposition"].startswith('attachment; filename="rankwise-profiles-')
    doc = json.loads(response.content)
    assert [p["name"] for p in doc["profiles"]] == ["open"]
    assert "sk-secret" not in response.content.decode() and "****" in response.content.decode()


def test_a_viewer_cannot_import(viewer_client):
    assert viewer_client.get(reverse("nodes:profiles-import")).status_code == 403


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"\xff\xfe", "not text"),
        (b"[1, 2", "not JSON"),
        (b'{"format": "something/2", "profiles": []}', "Nothing was imported"),
    ],
)
def test_a_file_that_is_not_an_export_is_refused_and_nothing_saved(operator_client, content, said):
    upload = SimpleUploadedFile("x.json", content, content_type="application/json")
    page = operator_client.post(reverse("nodes:profiles-import"), {"document": upload})
    assert page.status_code == 200 and said in page.content.decode()
    assert not LaunchProfile.objects.exists()


def test_the_file_is_named_after_a_stored_profile_never_the_query(viewer_client):
    _profile("open")
    one = viewer_client.get(reverse("nodes:profiles-export"), {"name": "open"})
    assert one["Content-Disposition"] == 'attachment; filename="rankwise-profiles-open.json"'
    odd = viewer_client.get(reverse("nodes:profiles-export"), {"name": 'x"\r\nSet-Cookie: a=b'})
    assert odd.status_code == 200 and "Set-Cookie" not in odd["Content-Disposition"]
    assert json.loads(odd.content)["profiles"] == []


def _upload(operator_client, doc: dict):
    upload = SimpleUploadedFile("x.json", json.dumps(doc).encode(), content_type="application/json")
    return operator_client.post(reverse("nodes:profiles-import"), {"document": upload})


def _doc(name: str, args: list[str], **profile) -> dict:
    revision = {"number": 1, "args": args, "sglang_version": "0.5.9"}
    return {
        "format": "rankwise-profiles/1",
        "profiles": [{"name": name, "revisions": [revision], **profile}],
    }


def test_a_refusal_does_not_repeat_a_secret_the_parser_complains_about(operator_client):
    page = _upload(
        operator_client, _doc("k", ["--model-path", "/m", "--api-keys", "sk-live-abc123"])
    )
    said = page.content.decode()
    assert "Nothing was imported" in said and "unrecognized arguments" in said
    assert "sk-live-abc123" not in said and "****" in said


def test_a_team_only_profile_of_a_team_the_importer_is_not_in_is_not_imported(operator_client):
    Team.objects.create(name="research")
    page = _upload(
        operator_client, _doc("hush", ["--model-path", "/m"], team="research", visibility="team")
    )
    assert (
        "owned by team research, which you are not a member of; not imported"
        in page.content.decode()
    )
    assert not LaunchProfile.objects.filter(name="hush").exists()


def test_an_import_under_the_name_of_a_hidden_profile_does_not_say_it_is_here(operator_client):
    """Found by an adversarial pass: the conflict list named another team's team-only profile
    ("already here, different"). The name is refused as any taken name is, and that is all."""
    _profile("hush", team=Team.objects.create(name="research"), visibility="team")
    page = html.unescape(
        _upload(operator_client, _doc("hush", ["--model-path", "/x"])).content.decode()
    )
    conflicts = page[page.index('class="conflicts"') :].split("</dd>")[0]
    assert "hush" not in conflicts
    assert "hush: not imported: that name cannot be used here; rename the profile" in page
    skipped = page[page.index('class="skipped"') :].split("</dd>")[0]
    assert "hush" not in skipped
    assert ProfileRevision.objects.filter(profile__name="hush").count() == 1


def test_a_team_only_profile_of_a_team_not_here_arrives_for_admins_alone(
    operator_client, viewer_client
):
    """Found by an adversarial pass: it arrived visible to everyone. An import never widens
    who may read a profile; a profile shown to everyone stays so without its team."""
    page = _upload(
        operator_client, _doc("hush", ["--model-path", "/m"], team="research", visibility="team")
    )
    assert "team 'research' is not here; the profile is team-only and seen by admins alone" in (
        html.unescape(page.content.decode())
    )
    hush = LaunchProfile.objects.get(name="hush")
    assert (hush.team, hush.visibility) == (None, "team")
    for client in (operator_client, viewer_client):
        assert client.get(reverse("nodes:profile-detail", args=[hush.pk])).status_code == 404
    _upload(operator_client, _doc("open", ["--model-path", "/m"], team="research"))
    assert LaunchProfile.objects.get(name="open").visibility == "everyone"
    assert viewer_client.get(reverse("nodes:profile-list")).content.decode().count("open") >= 1


def test_the_audit_of_an_import_names_no_profile_and_each_profile_gets_its_own_entry(
    operator_client,
):
    _upload(operator_client, _doc("open", ["--model-path", "/m"]))
    summary = AuditEntry.objects.get(action="profile.import")
    assert summary.after == {"created": 1, "skipped": 0, "conflicts": 0}
    entry = AuditEntry.objects.get(action="profile.imported")
    assert entry.object_repr == "open" and entry.after == {"revisions": ["@1"]}


def test_a_stamp_that_comes_in_an_import_is_shown_imported_and_counts_for_nothing(
    operator_client,
):
    """Found by a team lead: a hand-edited export marked any profile "known-good on sim-…"."""
    node = make_node("gpu-09", sglang_version="0.5.9")
    stamp = {
        "node": "gpu-09", "gpu_name": "NVIDIA H200", "gpu_count": 8,
        "gpu_memory_bytes": 96 * 2**30, "stamped_at": "2026-12-01T10:00:00+00:00",
        "healthy_seconds": 3600, "launched_by": "nobody",
    }  # fmt: skip
    doc = _doc("forged", ["--model-path", "/m"])
    doc["exported_at"] = "2026-12-01T11:00:00+00:00"
    doc["profiles"][0]["revisions"][0]["stamps"] = [stamp]
    _upload(operator_client, doc)
    forged = LaunchProfile.objects.get(name="forged")
    page = html.unescape(
        operator_client.get(reverse("nodes:profile-detail", args=[forged.pk])).content.decode()
    )
    assert "known-good</span>" not in page and "imported</span>" in page
    assert "from the file x.json imported by " in page and "exported 2026-12-01T11:00" in page
    # Known-good on that node (or its GPU class) lists nothing: nothing was earned here.
    listed = operator_client.get(reverse("nodes:profile-list"), {"node": node.name})
    assert "forged" not in listed.content.decode()
    # An export carries where it came from, so it stays imported wherever it goes next.
    exported = json.loads(operator_client.get(reverse("nodes:profiles-export")).content)
    (entry,) = exported["profiles"][0]["revisions"][0]["stamps"]
    assert entry["imported_from"].startswith("the file x.json imported by ")
