"""Journey (issue 19, item 1): a suggestion is a complete change that its own check passes.

On the simulated incident node (8 × 96 GiB, 449 GB, SGLang 0.5.9), llama-3-70b at TP 8 with
300 GB of HiCache per rank: 37 GB per rank fits the host, but SGLang 0.5.9 also needs the host
pool to hold more tokens than the device pool, which at mem-fraction 0.93 holds about 71 GiB per
rank. The form offers both flags with one button; a failed launch's page offers the same
complete change as ``manage.py diagnose --json`` of its bundle; a clone's proposal too. Each
passes ``manage.py budget`` on the node."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from nodes.domain import remedy
from nodes.flag_tables import table
from nodes.models import Launch, ProfileRevision
from nodes.services.model_facts import model_facts
from nodes.services.profiles import evaluate, node_memory, save_revision
from nodes.views.profiles import clone_to
from nodes.workflows import launching
from simfleet.models import MODELS
from tests.browser.test_node_journey import log_in
from tests.browser.test_reuse_journey import ready_node
from tests.cases import budget_with_change
from tests.conftest import manage_py
from tests.factories import make_user
from tests.fleet import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
LLAMA = "/srv/models/llama-3-70b"
COMMAND = (
    f"python3 -m sglang.launch_server --model-path {LLAMA} --tp-size 8 "
    "--mem-fraction-static 0.93 --enable-hierarchical-cache --hicache-size 300"
)


def _budget_on(node, args: list[str], tmp: Path, model: str = "llama-3-70b") -> tuple[int, dict]:
    """``manage.py budget`` on ``node`` as the inventory has it, for ``args``."""
    memory = node_memory(node)
    facts_doc = {
        "command": ["python3", "-m", "sglang.launch_server", *args],
        "node": {
            "host_ram_bytes": memory.host_ram_bytes,
            "mem_available_bytes": memory.mem_available_bytes,
            "gpus": [{"memory_total_bytes": size} for size in memory.gpu_memory_bytes],
        },
        "model_config": MODELS[model]["config"],
        "model_weights_bytes": model_facts(node, f"/srv/models/{model}").weights_bytes,
        "engine_version": node.sglang_version,
    }
    return budget_with_change(facts_doc, {}, tmp)


def test_the_form_applies_the_complete_suggestion_and_it_saves(
    panel, page, sim_fleet, launch_workers, settings, tmp_path
):
    node = ready_node(sim_fleet["incident"])
    make_user("olga", "operator")
    log_in(page, panel.url, "olga")
    page.goto(f"{panel.url}{reverse('nodes:profile-create')}")
    page.locator("#id_name").fill("llama-hicache")
    page.locator("#id_node").select_option(label=node.name)
    page.get_by_label("Start from a command line").fill(COMMAND)
    page.get_by_role("button", name="Load pasted command").click()

    panel_box = page.locator("#budget-panel")
    expect(panel_box).to_contain_text("BLOCK")
    expect(panel_box).to_contain_text("that is 37 GB per rank", timeout=30_000)
    suggestion = page.locator("#suggestion code")
    expect(suggestion).to_contain_text("--mem-fraction-static", timeout=30_000)
    change = suggestion.inner_text()
    assert change.startswith("--hicache-size 37 --mem-fraction-static 0.")
    page.get_by_role("button", name="Apply the suggested change").click()

    expect(page.locator(".messages")).to_contain_text(f"Applied the suggested change: {change}")
    expect(page.get_by_label("Host pool per TP rank (GB, 10^9 bytes)")).to_have_value("37")
    fraction = change.split()[-1]
    expect(page.locator("#id_mem_fraction_static")).to_have_value(fraction)
    expect(panel_box).to_contain_text("WARN", timeout=30_000)
    page.get_by_label("I have read the warnings").check()
    page.get_by_role("button", name="Save revision").click()
    expect(page.locator(".messages")).to_contain_text("Saved llama-hicache@1")

    saved = ProfileRevision.objects.get(profile__name="llama-hicache")
    assert saved.verdict == "warn"
    status, report = _budget_on(node, list(saved.args), tmp_path)
    assert status == 0 and report["verdict"] in ("ok", "warn"), report["messages"]


def test_a_failed_launch_offers_the_change_diagnose_json_offers_and_it_passes(
    panel, page, sim_fleet, launch_workers, settings, tmp_path
):
    node = ready_node(sim_fleet["incident"])
    olga = make_user("olga", "operator")
    failed = launching.submit(
        node=node, command=COMMAND, actor=olga, overrides={"budget": "reproducing the incident"}
    )
    wait_until(
        lambda: (row := Launch.objects.get(pk=failed.pk)).diagnosis and row.log_complete, 120, 0.5
    )

    log_in(page, panel.url, "olga")
    page.goto(f"{panel.url}{reverse('nodes:launch-detail', args=[failed.pk])}")
    diagnosis = page.locator("#diagnosis")
    expect(diagnosis).to_contain_text("host-oom-hicache")
    expect(diagnosis).to_contain_text("lower --mem-fraction-static with it")
    shown = page.locator("#suggested-change").inner_text()
    assert "--hicache-size 37" in shown and "--mem-fraction-static" in shown, shown

    # Item 8: the kill the 2 s sampler missed is marked with what the kernel log said; both
    # axes are labelled; GPUs that drew the same line are one line, named by their range.
    host = page.locator("figure[data-chart='Host RAM used']")
    expect(host.locator("[data-marker=kill]").first).to_contain_text("OOM kill (kernel log)")
    expect(host.locator(".y-ticks span")).to_have_count(3)
    expect(host.locator(".x-ticks span").last).to_contain_text(" s")
    gpus = page.locator("figure[data-chart='GPU memory used']")
    drawn = [line.get_attribute("points") for line in gpus.locator("polyline").all()]
    assert drawn and len(set(drawn)) == len(drawn), "two GPU lines drawn on each other"
    assert len(drawn) == gpus.locator(".legend li:not([data-marker])").count()
    for width in (1440, 1024):
        page.set_viewport_size({"width": width, "height": 900})
        wide = page.evaluate("document.documentElement.scrollWidth")
        assert wide <= width, f"the failed launch's page is {wide} px wide at {width} px"

    # The bundle the page offers, diagnosed by the CLI: the same change.
    archive = page.request.get(f"{panel.url}{reverse('nodes:launch-bundle', args=[failed.pk])}")
    assert archive.ok
    path = tmp_path / "bundle.tar.gz"
    path.write_bytes(archive.body())
    done = manage_py(settings, "diagnose", str(path), "--json")
    assert done.returncode == 0, done.stderr
    change = json.loads(done.stdout)["change"]
    assert remedy.describe(change) == shown
    with tarfile.open(path) as bundle:
        member = next(m for m in bundle.getmembers() if m.name.endswith("facts.json"))
        handle = bundle.extractfile(member)
        assert handle is not None
        facts_doc = json.load(io.TextIOWrapper(handle))
    status, report = budget_with_change(facts_doc, change, tmp_path)
    assert status == 0, report["messages"]

    # The page's Apply saves exactly that change.
    page.get_by_role("button", name="Apply as new revision").click()
    expect(page.locator(".messages")).to_contain_text(f"Fix from launch #{failed.pk}")
    saved = failed.revision.profile.latest()
    assert saved is not None
    assert list(saved.args) == remedy.with_changes(
        list(failed.revision.args), change, table(node.sglang_version)
    )


def test_a_clones_proposal_passes_the_budget_on_its_target(sim_fleet, launch_workers, tmp_path):
    big, small = ready_node(sim_fleet["incident"]), ready_node(sim_fleet["spare"])
    olga = make_user("olga", "operator")
    args = ["--model-path", LLAMA, "--tp-size", "2", "--enable-hierarchical-cache"]
    args += ["--hicache-size", "150"]
    model = model_facts(big, LLAMA)
    revision = save_revision(
        profile_name="llama-tp2", args=args, env={}, message="first", node=big,
        report=evaluate(args, big, model), model=model, actor=olga,
    )  # fmt: skip
    proposal = clone_to(revision, small)
    assert proposal["changes"], "the 200 GB node cannot take 2 × 150 GB: a change is proposed"
    status, report = _budget_on(small, proposal["proposed_args"], tmp_path)
    assert status == 0 and report["verdict"] == proposal["proposed"].verdict
