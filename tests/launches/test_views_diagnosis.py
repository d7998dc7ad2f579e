"""Failed launches on the page: the diagnosis first, its evidence marked in the log, the memory
timeline, the suggested fix applied as a re-validated revision; the failed list filtered by
category; bundles from other servers uploaded and diagnosed."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from nodes.domain import timeline
from nodes.models import (
    AuditEntry,
    BundleUpload,
    Launch,
    ProfileRevision,
)
from nodes.models.choices import LaunchStatus
from nodes.workflows import diagnosing
from tests.factories import make_failed, make_node, pool_lines

pytestmark = pytest.mark.django_db
CASES = Path(__file__).resolve().parents[1] / "fixtures" / "cases"
GB = 10**9
INCIDENT = ["--model-path", "/m", "--tp-size", "8", "--enable-hierarchical-cache"]


@pytest.fixture
def node():
    return make_node("gpu-01", sglang_version="0.5.9", mem_available_bytes=440 * GB)


@pytest.fixture
def incident(node):
    samples = [
        timeline.sample(0, 449 * GB, 440 * GB, {0: 1 * 2**30, 1: 1 * 2**30}),
        timeline.sample(30, 449 * GB, 200 * GB, {0: 60 * 2**30, 1: 61 * 2**30}),
        timeline.sample(50, 449 * GB, 1 * GB, {0: 88 * 2**30, 1: 88 * 2**30}),
    ]
    return make_failed(
        node,
        [*INCIDENT, "--hicache-size", "300"],
        pool_lines(300),
        memory_timeline=samples,
    )


def test_a_failed_launch_shows_its_diagnosis_first_with_the_numbers(viewer_client, incident):
    assert incident.diagnosis_category == "host-oom-hicache"
    page = viewer_client.get(reverse("nodes:launch-detail", args=[incident.pk])).content.decode()
    diagnosis = page.index('id="diagnosis"')
    assert diagnosis < page.index("Pre-flight check") < page.index("Server log")
    assert "8 ranks" in page and "2400 GB" in page and "440 GB available" in page
    # Evidence lines are named and marked in the log viewer.
    assert 'href="#line-3"' in page
    assert 'id="line-3" class="evidence"' in page and 'id="line-1" class="evidence"' not in page
    # The phase bar stays where the launch stopped; viewers cannot apply the fix.
    assert "Apply as new revision" not in page


def test_the_memory_timeline_is_drawn_from_the_samples(viewer_client, incident):
    page = viewer_client.get(reverse("nodes:launch-detail", args=[incident.pk])).content.decode()
    assert "Memory over the launch" in page
    assert 'aria-label="Host RAM used"' in page and 'aria-label="GPU memory used"' in page
    # Host RAM used: 9 GB, then 249 GB, then 448 GB of 449 GB — the line climbs to the top.
    assert "peak 448 GB" in page and "GPU 0: peak 88 GiB" in page
    assert page.count("<polyline") == 3


def test_applying_the_fix_saves_a_revalidated_revision_and_opens_the_launch_form(
    operator_client, incident
):
    page = operator_client.get(reverse("nodes:launch-detail", args=[incident.pk])).content.decode()
    assert "Apply as new revision" in page and "--hicache-size" in page
    response = operator_client.post(reverse("nodes:launch-apply-fix", args=[incident.pk]))
    revision = ProfileRevision.objects.get(profile__name="kimi", number=2)
    size = int(revision.args[revision.args.index("--hicache-size") + 1])
    assert revision.args.count("--hicache-size") == 1 and 8 * size <= 440
    assert revision.verdict != "block" and f"Fix from launch #{incident.pk}" in revision.message
    assert response.status_code == 302
    assert response.url.startswith(reverse("nodes:launch-create"))
    # The link names @2 as the operator reads it, not a database id.
    assert "profile=kimi&revision=2&" in response.url and "gpus=0%2C1" in response.url
    form = operator_client.get(response.url).content.decode()
    assert f'<option value="{revision.pk}" selected>' in form
    assert AuditEntry.objects.filter(
        action="profile.revision", object_id=str(revision.profile_id)
    ).exists()


def test_a_viewer_cannot_apply_a_fix(viewer_client, incident):
    response = viewer_client.post(reverse("nodes:launch-apply-fix", args=[incident.pk]))
    assert response.status_code == 403
    assert not ProfileRevision.objects.filter(number=2).exists()


def test_a_diagnosis_without_a_flag_change_saves_nothing(operator_client, node):
    launch = make_failed(
        node,
        ["--model-path", "/m", "--tp-size", "2"],
        ["ValueError: nccl_port at 31417 is not available in 60 seconds."],
        name="qwen",
    )
    assert launch.diagnosis_category == "port-in-use"
    response = operator_client.post(
        reverse("nodes:launch-apply-fix", args=[launch.pk]), follow=True
    )
    assert "suggests no flag change" in response.content.decode()
    assert ProfileRevision.objects.filter(profile__name="qwen").count() == 1


def test_failed_launches_are_listed_with_their_category_and_filtered(viewer_client, node, incident):
    other = make_node("gpu-02", sglang_version="0.5.9")
    port = make_failed(
        other,
        ["--model-path", "/m", "--tp-size", "2"],
        ["ValueError: nccl_port at 31417 is not available in 60 seconds."],
        name="qwen",
    )
    url = reverse("nodes:launch-list")
    page = viewer_client.get(url).content.decode()
    assert "host-oom-hicache" in page and "port-in-use" in page
    only = viewer_client.get(url, {"category": "port-in-use"}).content.decode()
    assert f"#{port.pk}<" in only and f"#{incident.pk}<" not in only
    by_node = viewer_client.get(url, {"node": "gpu-01", "status": "failed"}).content.decode()
    assert f"#{incident.pk}<" in by_node and f"#{port.pk}<" not in by_node
    none = viewer_client.get(url, {"category": "nccl-shm"}).content.decode()
    assert "No launches match" in none


def archive_of(case: Path) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in ("launch.log", "facts.json"):
            tar.add(case / name, arcname=f"{case.name}/{name}")
    buffer.seek(0)
    buffer.name = f"{case.name}.tar.gz"
    return buffer


def diagnosed(client: Any, upload: Any) -> str:
    """Upload as the page does, let the worker's job run (as the task does), read the result."""
    response = client.post(reverse("nodes:bundle-diagnose"), {"bundle": upload})
    assert response.status_code == 302, response.content.decode()[:500]
    job = BundleUpload.objects.get(pk=response.url.rstrip("/").rsplit("/", 1)[1])
    pending = client.get(response.url).content.decode()
    assert 'hx-trigger="every 1s"' in pending and job.result is None  # not read by the web
    diagnosing.diagnose_upload(job.pk)
    return str(client.get(response.url).content.decode())


def test_an_uploaded_bundle_from_another_server_is_diagnosed(viewer_client, celery_app_for_tests):
    page = diagnosed(viewer_client, archive_of(CASES / "C05"))
    assert "host-mem-precheck" in page and 'hx-trigger="every' not in page
    assert "34.13 GB usable" in page and "line " in page
    assert not Launch.objects.exists()


def test_an_upload_that_is_no_archive_is_refused_with_the_reason(
    viewer_client, celery_app_for_tests
):
    upload = io.BytesIO(b"not an archive")
    upload.name = "x.tar.gz"
    page = diagnosed(viewer_client, upload)
    assert "x.tar.gz is not a tar archive: not a .tar, .tar.gz" in page


def test_an_empty_upload_is_refused_by_the_form(viewer_client):
    upload = io.BytesIO(b"")
    upload.name = "x.tar.gz"
    response = viewer_client.post(reverse("nodes:bundle-diagnose"), {"bundle": upload})
    assert response.status_code == 200
    assert "The submitted file is empty" in response.content.decode()
    assert not BundleUpload.objects.exists()


def test_only_the_uploader_sees_the_result(viewer_client, operator_client, celery_app_for_tests):
    response = viewer_client.post(
        reverse("nodes:bundle-diagnose"), {"bundle": archive_of(CASES / "C05")}
    )
    assert operator_client.get(response.url).status_code == 404


def test_a_second_click_does_not_save_the_fix_twice(operator_client, incident):
    url = reverse("nodes:launch-apply-fix", args=[incident.pk])
    operator_client.post(url)
    again = operator_client.post(url, follow=True).content.decode()
    assert "already saved as kimi@2" in again
    assert ProfileRevision.objects.filter(profile__name="kimi").count() == 2


def test_only_a_failed_launch_with_a_diagnosis_can_be_fixed(operator_client, incident):
    Launch.objects.filter(pk=incident.pk).update(status=LaunchStatus.STOPPED)
    url = reverse("nodes:launch-apply-fix", args=[incident.pk])
    assert "did not fail (stopped)" in operator_client.post(url, follow=True).content.decode()
    Launch.objects.filter(pk=incident.pk).update(status=LaunchStatus.FAILED, diagnosis=None)
    assert "has no diagnosis yet" in operator_client.post(url, follow=True).content.decode()
    assert ProfileRevision.objects.count() == 1


@pytest.mark.parametrize(
    "stored",
    [
        ["not", "an", "object"],
        {"category": "host-oom-hicache", "changes": ["--hicache-size"], "evidence": "abc"},
        {"category": "host-oom-hicache", "changes": {"--no-such-flag": 3}, "evidence": [None]},
    ],
)
def test_a_damaged_stored_diagnosis_degrades_instead_of_failing(operator_client, incident, stored):
    Launch.objects.filter(pk=incident.pk).update(diagnosis=stored)
    page = operator_client.get(reverse("nodes:launch-detail", args=[incident.pk]))
    assert page.status_code == 200
    applied = operator_client.post(
        reverse("nodes:launch-apply-fix", args=[incident.pk]), follow=True
    )
    assert applied.status_code == 200 and ProfileRevision.objects.count() == 1


def test_list_filters_that_no_database_can_compare_are_ignored(viewer_client, incident):
    url = reverse("nodes:launch-list")
    for query in ({"node": "\x00"}, {"category": "\x00abc"}, {"category": "x" * 500}):
        response = viewer_client.get(url, query)
        assert response.status_code == 200 and f"#{incident.pk}<" in response.content.decode()


def test_an_uploaded_bundle_shows_no_secret_its_log_spells_out(
    viewer_client, tmp_path, celery_app_for_tests
):
    case = tmp_path / "secret"
    case.mkdir()
    (case / "launch.log").write_text(
        "HF_TOKEN=hf_topsecret python3 -m sglang.launch_server --api-key sk-topsecret\n"
        "ValueError: The repository for /m contains custom code which must be executed\n"
    )
    (case / "facts.json").write_text('{"format": "rankwise-case/1"}')
    page = diagnosed(viewer_client, archive_of(case))
    assert "trust-remote-code" in page and "topsecret" not in page


class Newlines(io.RawIOBase):
    """``size`` bytes of newlines, produced as read (the bomb is never whole in memory)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = b"\n" * n
        self.left -= n
        return n


def bomb() -> io.BytesIO:
    """The issue's upload: 64 MiB of newlines and a minimal facts.json, about 65 KB gzipped."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=9) as tar:
        info = tarfile.TarInfo("bomb/launch.log")
        info.size = 64 * 2**20
        tar.addfile(info, io.BufferedReader(Newlines(info.size)))
        facts = b'{"format": "rankwise-case/1"}'
        info = tarfile.TarInfo("bomb/facts.json")
        info.size = len(facts)
        tar.addfile(info, io.BytesIO(facts))
    buffer.seek(0)
    buffer.name = "bomb.tar.gz"
    return buffer


def test_a_decompression_bomb_is_refused_after_a_bounded_read():
    import tracemalloc

    from nodes.domain.bundle import BundleError
    from nodes.services.bundles import MAX_UPLOAD_LOG_LINES, read_bundle_file

    upload = bomb()
    assert len(upload.getvalue()) < 200_000
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match="launch.log has more than 250,000 lines"):
            read_bundle_file(upload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # It stopped a chunk after the line limit, never holding the 64 MiB (let alone its lines).
    assert MAX_UPLOAD_LOG_LINES == 250_000 and peak < 8 * 2**20


def test_a_bomb_posted_to_the_page_is_left_to_the_worker_which_refuses_it(
    viewer_client, celery_worker
):
    from celery.result import AsyncResult

    response = viewer_client.post(reverse("nodes:bundle-diagnose"), {"bundle": bomb()})
    assert response.status_code == 302
    job_id = response.url.rstrip("/").rsplit("/", 1)[1]
    assert AsyncResult(job_id).get(timeout=60) == "refused"
    page = viewer_client.get(response.url).content.decode()
    assert "launch.log has more than 250,000 lines: not read" in page
    assert not BundleUpload.objects.get(pk=job_id).data  # the archive is not kept
