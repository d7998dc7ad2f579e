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
