"""Reusing profiles: cloning a revision to another node proposes what must change there and
saves only after the operator accepts and edits; stamps listed; the list filters."""

from __future__ import annotations

import pytest
from django.urls import reverse

from nodes.models import LaunchProfile, ProfileRevision
from tests.factories import make_node

pytestmark = pytest.mark.django_db
GB = 10**9
ARGS = [
    "--model-path", "/m", "--tp-size", "8", "--enable-hierarchical-cache", "--hicache-size", "37",
]  # fmt: skip


@pytest.fixture
def revision():
    big = make_node("big", sglang_version="0.5.9", mem_available_bytes=440 * GB)
    profile = LaunchProfile.objects.create(name="kimi", created_by="pat")
    return ProfileRevision.objects.create(
        profile=profile, number=1, args=ARGS, env={}, author="pat", node=big, verdict="ok",
        report={"lines": [], "messages": []}, sglang_version="0.5.9",
    )  # fmt: skip


@pytest.fixture
def small():
    return make_node(
        "small", sglang_version="0.5.9", host_ram_bytes=200 * GB, mem_available_bytes=190 * GB
    )


def test_cloning_to_a_smaller_node_proposes_the_hicache_size_that_fits(
    operator_client, revision, small
):
    url = reverse("nodes:profile-clone", args=[revision.profile_id])
    page = operator_client.get(url, {"revision": 1, "node": small.pk}).content.decode()
    assert 'data-verdict="block"' in page and "What must change on small" in page
    start = page.index('<table class="table changes">')
    row = page[start : page.index("</table>", start)]
    assert "--hicache-size" in row and "<td>37</td>" in row
    proposed = int(row.split("<strong>")[1].split("</strong>")[0])
    assert 8 * proposed < 190 and proposed < 37

    edit = page.split('class="button primary" href="')[1].split('"')[0].replace("&amp;", "&")
    form = operator_client.get(edit).content.decode()
    assert "Cloned from kimi@1 to small." in form and f"--hicache-size {proposed}" in form
    assert 'value="kimi-small"' in form

    saved = operator_client.post(
        reverse("nodes:profile-create"),
        {
            "action": "load",
            "name": "kimi-small",
            "node": small.pk,
            "pasted_command": (
                "python3 -m sglang.launch_server --model-path /m --tp-size 8 "
                f"--enable-hierarchical-cache --hicache-size {proposed}"
            ),
        },
    )
    assert saved.status_code == 200
    # Nothing is saved until the operator saves.
    assert not LaunchProfile.objects.filter(name="kimi-small").exists()


def test_viewers_cannot_clone(viewer_client, revision, small):
    url = reverse("nodes:profile-clone", args=[revision.profile_id])
    assert viewer_client.get(url, {"node": small.pk}).status_code == 403


def test_an_unknown_revision_or_node_explains_itself(operator_client, revision):
    url = reverse("nodes:profile-clone", args=[revision.profile_id])
    page = operator_client.get(url, {"revision": 9}).content.decode()
    assert "This profile has no such revision." in page
    page = operator_client.get(url, {"node": "x"}).content.decode()
    assert "Target node" in page and "What must change" not in page


def test_diff_between_any_two_revisions_and_revert_makes_a_new_equal_one(operator_client, revision):
    ProfileRevision.objects.create(
        profile=revision.profile, number=2, args=[*ARGS[:-1], "300", "--trust-remote-code"],
        env={"HF_TOKEN": "hf_x"}, author="olga", node=revision.node, verdict="block",
        report={"lines": [], "messages": [{"level": "block", "code": "host", "text": "2400 GB"}]},
    )  # fmt: skip
    url = reverse("nodes:profile-diff", args=[revision.profile_id])
    page = operator_client.get(url, {"a": 1, "b": 2}).content.decode()
    assert '<tr class="diff-changed"><td class="mono">--hicache-size</td>' in page
    assert '<td class="mono">37</td><td class="mono">300</td>' in page
    assert '<tr class="diff-added"><td class="mono">--trust-remote-code</td>' in page
    assert "env HF_TOKEN" in page and "hf_x" not in page
    assert "block: 2400 GB" in page and "badge-ok" in page

    revert = reverse("nodes:profile-revert", args=[revision.profile_id, 1])
    operator_client.post(revert)
    newest = revision.profile.latest()
    assert newest.number == 3 and newest.args == ARGS and newest.message == "Revert to @1"
    assert ProfileRevision.objects.get(number=1).args == ARGS  # the old one is untouched
    same = operator_client.get(url, {"a": 1, "b": 3}).content.decode()
    assert "run the same flags and environment" in same


def test_viewers_cannot_revert(viewer_client, revision):
    response = viewer_client.post(reverse("nodes:profile-revert", args=[revision.profile_id, 1]))
    assert response.status_code == 403 and ProfileRevision.objects.count() == 1
