"""The launch pages: roles, a form that refuses bad input without saving anything, the log."""

from __future__ import annotations

import gzip
import io
import tarfile
from typing import Any

import pytest
from django.test import AsyncClient
from django.urls import reverse

from nodes.models import Launch, LaunchLogLine, LaunchProfile, ProfileRevision, Reservation
from nodes.models.choices import LaunchStatus
from tests.factories import make_node
from tests.sse import in_fresh_loop, read_stream

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def node():
    return make_node("gpu-01", host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake")


@pytest.fixture
def revision(node):
    profile = LaunchProfile.objects.create(name="qwen", created_by="pat")
    return ProfileRevision.objects.create(
        profile=profile,
        number=1,
        args=["--model-path", "/models/qwen", "--tp-size", "2", "--api-key", "sk-xyz"],
        env={},
        author="pat",
        node=node,
        verdict="ok",
        report={"lines": [], "messages": []},
    )


def make_launch(revision, node, **fields) -> Launch:
    fields.setdefault("status", LaunchStatus.READY)
    return Launch.objects.create(
        revision=revision,
        node=node,
        gpus=[0, 1],
        port=30000,
        created_by="olga",
        startup_timeout_s=60,
        **fields,
    )


def test_an_operator_launches_a_revision_and_gpus_are_reserved(operator_client, node, revision):
    response = operator_client.post(
        reverse("nodes:launch-create"), {"revision": revision.pk, "node": node.pk, "gpus": "2,3"}
    )
    launch = Launch.objects.get()
    assert response.status_code == 302 and response.url == f"/launches/{launch.pk}/"
    assert launch.gpus == [2, 3] and launch.status == LaunchStatus.PENDING
    assert set(Reservation.objects.values_list("kind", "number")) == {
        ("gpu", 2),
        ("gpu", 3),
        ("port", 30000),
    }
    page = operator_client.get(response.url).content.decode()
    assert "Pre-flight" in page and "sk-xyz" not in page


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "Choose a profile revision or paste a command"),
        ({"gpus": "one"}, "GPU indexes separated by commas"),
        ({"gpus": "0"}, "needs 2 GPU"),
        ({"gpus": "0,1", "override": ["budget"]}, "Say why"),
    ],
)
def test_bad_input_is_explained_and_nothing_is_saved(
    operator_client, node, revision, data, message
):
    base = {"revision": revision.pk, "node": node.pk}
    if not data:
        base["command"] = "python3 -m sglang.launch_server --model-path /m"
    response = operator_client.post(reverse("nodes:launch-create"), {**base, **data})
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Launch.objects.exists() and not Reservation.objects.exists()


def test_a_pasted_command_on_an_untrusted_node_saves_no_adhoc_profile(operator_client):
    node = make_node("new-node")
    response = operator_client.post(
        reverse("nodes:launch-create"),
        {"node": node.pk, "command": "python3 -m sglang.launch_server --model-path /m"},
    )
    assert "host key is not trusted" in response.content.decode()
    assert not LaunchProfile.objects.exists()


def test_gpus_held_by_a_running_launch_are_refused_clearly(operator_client, node, revision):
    first = make_launch(revision, node)
    Reservation.objects.create(node=node, kind="gpu", number=0, launch=first)
    operator_client.post(
        reverse("nodes:launch-create"), {"revision": revision.pk, "node": node.pk, "gpus": "0,1"}
    )
    second = Launch.objects.exclude(pk=first.pk).get()
    assert second.status == LaunchStatus.BLOCKED
    assert f"GPU 0 by launch #{first.pk}" in second.reason
    assert not second.reservations.exists()


def test_viewers_see_launches_but_cannot_launch_or_stop(viewer_client, node, revision):
    launch = make_launch(revision, node)
    assert viewer_client.get(reverse("nodes:launch-list")).status_code == 200
    assert viewer_client.get(reverse("nodes:launch-detail", args=[launch.pk])).status_code == 200
    assert viewer_client.post(reverse("nodes:launch-create"), {}).status_code == 403
    assert viewer_client.post(reverse("nodes:launch-stop", args=[launch.pk])).status_code == 403
    launch.refresh_from_db()
    assert launch.status == LaunchStatus.READY


def test_the_list_filters_by_status_and_node(viewer_client, node, revision):
    make_launch(revision, node, status=LaunchStatus.FAILED, reason="the server exited")
    make_launch(revision, node, status=LaunchStatus.READY)
    page = viewer_client.get(reverse("nodes:launch-list") + "?status=failed").content.decode()
    assert "the server exited" in page and page.count("badge-ready") == 0


def test_lines_after_a_sequence_number_and_the_full_download(viewer_client, node, revision):
    launch = make_launch(revision, node, status=LaunchStatus.STOPPED, last_seq=3, log_complete=True)
    LaunchLogLine.objects.bulk_create(
        LaunchLogLine(launch=launch, seq=i, text=f"line {i}") for i in (1, 2, 3)
    )
    doc = viewer_client.get(reverse("nodes:launch-lines", args=[launch.pk]) + "?after=1").json()
    # [seq, text, level, rank, node]: the node is "" on a launch of one node.
    assert doc["lines"] == [[2, "line 2", 0, "", ""], [3, "line 3", 0, "", ""]] and doc["ended"]
    download = viewer_client.get(reverse("nodes:launch-log", args=[launch.pk]))
    assert b"".join(download.streaming_content) == b"line 1\nline 2\nline 3\n"
    launch.log_archive = gzip.compress(b"the whole log\n")
    launch.save()
    download = viewer_client.get(reverse("nodes:launch-log", args=[launch.pk]))
    assert b"".join(download.streaming_content) == b"the whole log\n"


def test_an_archived_raw_log_is_served_masked_in_the_download_and_the_bundle(
    viewer_client, node, revision
):
    # Past RANKWISE_LOG_LINES_MAX the whole log comes from the node's file, which holds the key
    # in clear (archives from before masking at archive time, too).
    raw = (
        b"server_args=ServerArgs(api_key='sk-xyz', max_total_tokens=100000)\n"
        b"python3 -m sglang.launch_server --api-key sk-xyz --max-total-tokens 100000\n"
        b"max_total_num_tokens=100000\n"
    )
    launch = make_launch(revision, node, status=LaunchStatus.STOPPED, log_complete=True)
    Launch.objects.filter(pk=launch.pk).update(log_archive=gzip.compress(raw), lines_dropped=5)
    download = viewer_client.get(reverse("nodes:launch-log", args=[launch.pk]))
    text = b"".join(download.streaming_content)
    assert b"sk-xyz" not in text and text.count(b"100000") == 3
    assert b"api_key='****'" in text and b"--api-key ****" in text
    bundle = viewer_client.get(reverse("nodes:launch-bundle", args=[launch.pk])).content
    with tarfile.open(fileobj=io.BytesIO(bundle)) as archive:
        member = archive.extractfile(f"launch-{launch.pk}/launch.log")
        assert member is not None and member.read() == text


def test_the_live_stream_resumes_after_the_last_event_id_and_ends(viewer, node, revision):
    launch = make_launch(revision, node, status=LaunchStatus.STOPPED, last_seq=3, log_complete=True)
    launch.started = launch.created
    launch.save()
    LaunchLogLine.objects.bulk_create(
        LaunchLogLine(launch=launch, seq=i, text=f"line {i}") for i in (1, 2, 3)
    )
    url = reverse("nodes:launch-events", args=[launch.pk])

    async def fetch() -> tuple[Any, str, int]:
        client = AsyncClient()
        await client.aforce_login(viewer)
        response = await client.get(url, headers={"Last-Event-ID": "1"})
        anonymous = await AsyncClient().get(url)
        return response, await read_stream(response), anonymous.status_code

    response, body, anonymous = in_fresh_loop(fetch())
    assert response["Content-Type"] == "text/event-stream"
    assert 'id: 3\nevent: lines\ndata: [[2, "line 2", 0, "", ""], [3, "line 3", 0, "", ""]]' in body
    assert "line 1" not in body and body.rstrip().endswith("event: end\ndata: {}")
    assert anonymous == 403


def test_the_node_page_lists_its_launches(viewer_client, node, revision):
    launch = make_launch(revision, node, status=LaunchStatus.FAILED)
    page = viewer_client.get(reverse("nodes:node-detail", args=[node.pk])).content.decode()
    assert f'href="/launches/{launch.pk}/"' in page and "Failed" in page


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"command": "python3 -m sglang.launch_server --model-path /m\x00"}, "Null characters"),
        ({"command": "  "}, "Choose a profile revision or paste a command."),
        (
            {"command": "cd /x && python3 -m sglang.launch_server --model-path /m"},
            "would not be run",
        ),
        (
            {"command": "python3 -m sglang.launch_server --model-path /m --nccl-port 0"},
            "--nccl-port 0 is not a TCP port",
        ),
        (
            {"command": "python3 -m sglang.launch_server --model-path /m '$(id)'"},
            "unrecognized arguments: $(id)",
        ),
    ],
)
def test_the_form_says_what_is_wrong_with_a_pasted_command(operator_client, node, data, message):
    response = operator_client.post(reverse("nodes:launch-create"), {"node": node.pk, **data})
    assert message in response.content.decode()
    assert not Launch.objects.exists() and not LaunchProfile.objects.exists()


def test_a_blocked_adhoc_launch_is_launched_again_with_its_own_revision(operator_client, node):
    profile = LaunchProfile.objects.create(name="ad-hoc x", created_by="olga", adhoc=True)
    revision = ProfileRevision.objects.create(
        profile=profile,
        number=1,
        args=["--model-path", "/m", "--tp-size", "2"],
        env={"HF_TOKEN": "hf_real"},
        author="olga",
        node=node,
        verdict="ok",
        report={},
    )
    blocked = make_launch(
        revision,
        node,
        status=LaunchStatus.BLOCKED,
        checks=[{"name": "shm", "passed": False, "detail": "/dev/shm is 64 MiB", "override": ""}],
    )
    page = operator_client.get(reverse("nodes:launch-detail", args=[blocked.pk])).content
    assert b"hf_real" not in page and b"Launch again" in page
    response = operator_client.post(
        reverse("nodes:launch-create"),
        {
            "adhoc_revision": revision.pk,
            "node": node.pk,
            "gpus": "0,1",
            "override": ["shm"],
            "reason": "small model",
        },
    )
    again = Launch.objects.exclude(pk=blocked.pk).get()
    assert response.status_code == 302 and again.revision == revision
    assert again.overrides == {"shm": "small model"}


def test_a_ready_servers_page_says_where_it_answers_and_for_how_long(viewer_client, node):
    from datetime import timedelta

    from django.utils import timezone

    profile = LaunchProfile.objects.create(name="qwen", created_by="olga")
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, args=["--model-path", "/m", "--host", "0.0.0.0"], env={},
        author="olga", node=node, verdict="ok", report={},
    )  # fmt: skip
    ready = make_launch(revision, node, ready_at=timezone.now() - timedelta(hours=2))
    page = viewer_client.get(reverse("nodes:launch-detail", args=[ready.pk])).content.decode()
    assert f"http://{node.host}:30000" in page
    assert f"ssh -N -p {node.port} -L 30000:127.0.0.1:30000 {node.ssh_user}@{node.host}" in page
    assert "Up for" in page and "2\xa0hours" in page


def test_an_adhoc_launch_is_saved_as_a_named_profile_and_bad_names_change_nothing(
    operator_client, node, settings
):
    settings.RANKWISE_MODEL_READ_WAIT_SECONDS = 0  # the model is not read here: no node behind
    profile = LaunchProfile.objects.create(name="ad-hoc 1a2b", created_by="olga", adhoc=True)
    revision = ProfileRevision.objects.create(
        profile=profile, number=2, args=["--model-path", "/m", "--tp-size", "2"], env={},
        author="olga", node=node, verdict="ok", report={}, message="Fix from launch #1",
    )  # fmt: skip
    launch = make_launch(revision, node, status=LaunchStatus.FAILED)
    url = reverse("nodes:launch-promote", args=[launch.pk])
    page = operator_client.get(reverse("nodes:launch-detail", args=[launch.pk])).content.decode()
    assert url in page and "Save as profile" in page
    for bad, why in (("", "name"), ("ad-hoc again", "ad-hoc"), ("ad-hoc 1a2b", "ad-hoc")):
        answer = operator_client.post(url, {"name": bad}, follow=True).content.decode()
        assert "Not saved" in answer and why in answer, bad
    assert LaunchProfile.objects.filter(adhoc=False).count() == 0
    answer = operator_client.post(url, {"name": "qwen-tp2"}, follow=True)
    saved = LaunchProfile.objects.get(name="qwen-tp2")
    assert not saved.adhoc and saved.latest().args == revision.args
    assert saved.latest().message == f"From {revision} (ad-hoc)"
    assert answer.redirect_chain[-1][0] == reverse("nodes:profile-detail", args=[saved.pk])
    again = operator_client.post(url, {"name": "qwen-tp2"}, follow=True).content.decode()
    assert "already exists" in again and LaunchProfile.objects.filter(name="qwen-tp2").count() == 1


def test_a_launch_the_budget_blocked_offers_its_complete_change_as_a_new_revision(
    operator_client, settings
):
    settings.RANKWISE_MODEL_READ_WAIT_SECONDS = 0  # no node behind: the model is not read
    node = make_node("gpu-09", host_ram_bytes=449 * 10**9, mem_available_bytes=408 * 10**9,
                     sglang_version="0.5.9")  # fmt: skip
    profile = LaunchProfile.objects.create(name="kimi", created_by="olga")
    args = ["--model-path", "/m", "--tp-size", "8", "--enable-hierarchical-cache",
            "--hicache-size", "300"]  # fmt: skip
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, args=args, env={}, author="olga", node=node, verdict="ok",
        report={},
    )  # fmt: skip
    failed = [{"name": "budget", "passed": False, "detail": "8 × 300 GB", "override": ""}]
    launch = make_launch(revision, node, status=LaunchStatus.BLOCKED, checks=failed)
    page = operator_client.get(reverse("nodes:launch-detail", args=[launch.pk])).content.decode()
    assert 'id="suggested-change">--hicache-size 37</code>' in page
    response = operator_client.post(reverse("nodes:launch-apply-fix", args=[launch.pk]))
    saved = ProfileRevision.objects.get(profile=profile, number=2)
    assert saved.args[-2:] == ["--hicache-size", "37"] and saved.verdict != "block"
    assert "Fix from launch" in saved.message and response.status_code == 302


def test_the_launch_link_names_the_revision_as_the_operator_reads_it(operator_client, node):
    """Found by a newcomer: ``?revision=3`` (a database id) launched @2. A profile's *Launch @N*
    opens the form with @N of that profile, whatever ids other profiles took."""
    other = LaunchProfile.objects.create(name="other", created_by="pat")
    for number in (1, 2):
        ProfileRevision.objects.create(
            profile=other, number=number, args=["--model-path", "/o"], env={}, author="pat",
            node=node, verdict="ok", report={},
        )  # fmt: skip
    qwen = LaunchProfile.objects.create(name="qwen", created_by="pat")
    for number in (1, 2):
        ProfileRevision.objects.create(
            profile=qwen, number=number, args=["--model-path", f"/q{number}"], env={},
            author="pat", node=node, verdict="ok", report={},
        )  # fmt: skip
    page = operator_client.get(reverse("nodes:profile-detail", args=[qwen.pk])).content.decode()
    assert "?profile=qwen&amp;revision=2&amp;node=" in page
    form = operator_client.get(
        reverse("nodes:launch-create"), {"profile": "qwen", "revision": "2"}
    ).content.decode()
    wanted = ProfileRevision.objects.get(profile=qwen, number=2)
    assert f'<option value="{wanted.pk}" selected>qwen@2' in form, form
    for bad in ({"profile": "qwen", "revision": "9"}, {"profile": "nope", "revision": "1"},
                {"revision": str(wanted.pk)}):  # fmt: skip
        form = operator_client.get(reverse("nodes:launch-create"), bad).content.decode()
        assert " selected>qwen@" not in form and " selected>other@" not in form


def test_ad_hoc_commands_are_told_apart_by_model_tp_and_time():
    from datetime import datetime

    from nodes.workflows.launching import adhoc_name

    when = datetime(2026, 12, 4, 21, 27, 30)
    args = ["--model-path", "/srv/models/qwen2.5-7b/", "--tp-size", "2"]
    assert (
        adhoc_name(args, "0.5.9", when, "751d6a") == "ad-hoc qwen2.5-7b tp2 20261204-212730-751d6a"
    )
    long = ["--model-path", "/m/" + "x" * 80, "--tp", "8"]
    name = adhoc_name(long, "0.5.9", when, "751d6a")
    assert len(name) <= 63 and name.startswith("ad-hoc " + "x" * 24 + " tp8 ")


def test_the_phase_bar_has_a_host_pool_only_with_hierarchical_cache(viewer_client, node, revision):
    """Found by a newcomer: "Host pool" was marked done for a server with no HiCache."""
    ready = {"phase": "ready"}
    plain = make_launch(revision, node, progress=ready)
    page = viewer_client.get(reverse("nodes:launch-detail", args=[plain.pk])).content.decode()
    bar = page[page.index('class="phase-list"') :].split("</ol>")[0]
    assert "Host pool" not in bar and "CUDA graphs" in bar
    hicache = ProfileRevision.objects.create(
        profile=revision.profile, number=2, env={}, author="pat", node=node, verdict="ok",
        report={}, args=[*revision.args, "--enable-hierarchical-cache", "--hicache-size", "37"],
    )  # fmt: skip
    pooled = make_launch(hicache, node, progress=ready)
    page = viewer_client.get(reverse("nodes:launch-detail", args=[pooled.pk])).content.decode()
    bar = page[page.index('class="phase-list"') :].split("</ol>")[0]
    assert '<li class="done">Host pool</li>' in bar
