"""Journey (issue 19, item 10): export and import launch profiles from the panel, with the
API's checks and report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import expect

from nodes.models import AuditEntry, LaunchProfile, ProfileRevision
from tests.browser.test_node_journey import log_in
from tests.factories import make_node, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
ARGS = ["--model-path", "/m", "--tp-size", "2"]


def test_export_then_import_a_copy_and_a_file_that_is_refused(live_server, page, tmp_path):
    make_user("otto", "operator")
    node = make_node("gpu-01", sglang_version="0.5.9")
    profile = LaunchProfile.objects.create(name="qwen", created_by="otto")
    ProfileRevision.objects.create(
        profile=profile, number=1, args=ARGS, env={}, author="otto", node=node, verdict="ok",
        report={},
    )  # fmt: skip
    log_in(page, live_server.url, "otto")
    page.get_by_role("link", name="Launch profiles").click()
    with page.expect_download() as download:
        page.get_by_role("link", name="Export").click()
    exported = Path(download.value.path())
    doc = json.loads(exported.read_text())
    assert doc["format"] == "rankwise-profiles/1"
    assert [p["name"] for p in doc["profiles"]] == ["qwen"]

    # The same file back: nothing new, said so.
    page.get_by_role("link", name="Import…").click()
    page.get_by_label("Export file").set_input_files(str(exported))
    page.get_by_role("button", name="Import").click()
    report = page.locator("#import-report")
    expect(report.locator(".skipped")).to_contain_text("qwen@1")
    expect(report.locator(".created")).to_have_text("none")

    # A copy under another name comes in as a new profile.
    doc["profiles"][0]["name"] = "qwen-copy"
    copy = tmp_path / "copy.json"
    copy.write_text(json.dumps(doc))
    page.get_by_label("Export file").set_input_files(str(copy))
    page.get_by_role("button", name="Import").click()
    expect(report.locator(".created")).to_contain_text("qwen-copy@1")
    assert list(ProfileRevision.objects.get(profile__name="qwen-copy").args) == ARGS
    assert AuditEntry.objects.filter(action="profile.import").count() == 2

    # A revision the node's SGLang refuses stops the whole import: nothing is saved.
    doc["profiles"][0]["name"] = "broken"
    doc["profiles"][0]["revisions"][0]["args"] = ["--model-path", "/m", "--no-such-flag"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    page.get_by_label("Export file").set_input_files(str(bad))
    page.get_by_role("button", name="Import").click()
    expect(page.locator(".errorlist")).to_contain_text("Nothing was imported")
    expect(page.locator("#import-report")).to_have_count(0)
    assert not LaunchProfile.objects.filter(name="broken").exists()

    # Not JSON at all: said, nothing saved.
    junk = tmp_path / "junk.json"
    junk.write_text("not json {")
    page.get_by_label("Export file").set_input_files(str(junk))
    page.get_by_role("button", name="Import").click()
    expect(page.locator(".errorlist")).to_contain_text("The file is not JSON")

    # The profile's own page exports that profile alone.
    page.goto(f"{live_server.url}/launch-profiles/{profile.pk}/")
    with page.expect_download() as one:
        page.get_by_role("link", name="Export").click()
    only = json.loads(Path(one.value.path()).read_text())
    assert [p["name"] for p in only["profiles"]] == ["qwen"]
