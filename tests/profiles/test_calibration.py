"""Calibration from real start-ups: the log parser, a pasted log, ``manage.py budget
--calibrate-from``, and a launch on the simulated fleet calibrating the next estimate."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from nodes.domain.calibration import CalibrationError, parse, pool_settings_in
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import table
from nodes.models import (
    AuditEntry,
    Calibration,
    Gpu,
    Launch,
    LaunchProfile,
    ModelReading,
    Node,
    ProfileRevision,
)
from nodes.models.choices import LaunchStatus
from nodes.services import calibrations, model_facts, profiles
from nodes.workflows import discovery, ending, launching
from simfleet.models import MODELS
from tests.conftest import register_sim_node
from tests.factories import make_node, make_user
from tests.fleet import wait_until

ROOT = Path(__file__).resolve().parents[2]
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake"
S01 = ROOT / "tests/fixtures/cases/S01"
GiB = 2**30
S01_ARGS = ["--model-path", "/models/kimi-k2.5-int4", "--tp-size", "8", "--mem-fraction-static"]


def test_the_parser_reads_every_rank_and_keeps_sglangs_figures():
    figures = parse((S01 / "launch.log").read_text().splitlines())
    assert figures.free_before_load_bytes == round(94.62 * GiB)
    assert figures.weights_per_rank_bytes == round(72.42 * GiB)
    assert figures.kv_tokens == 238_007
    assert [r.rank for r in figures.ranks] == list(range(8))
    # The least free memory over the ranks is what SGLang uses.
    skewed = parse(
        [
            "[t TP0] Load weight begin. avail mem=90.00 GB",
            "[t TP1] Load weight begin. avail mem=80.00 GB",
            "[t TP0] Load weight end. type=X, avail mem=20.00 GB, mem usage=70.00 GB.",
        ]
    )
    assert skewed.free_before_load_bytes == 80 * GiB and skewed.kv_tokens is None


def test_a_log_without_weight_lines_cannot_calibrate():
    with pytest.raises(CalibrationError, match="Load weight begin"):
        parse(["[t TP0] KV Cache is allocated. #tokens: 5, KV size: 1 GB"])


def test_calibrate_from_a_log_on_the_command_line(tmp_path):
    facts = json.loads((S01 / "facts.json").read_text())
    node, config = tmp_path / "node.json", tmp_path / "config.json"
    node.write_text(json.dumps(facts["node"]))
    config.write_text(json.dumps(facts["model_config"]))
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "budget",
            "--node",
            str(node),
            "--model-config",
            str(config),
            "--calibrate-from",
            str(S01 / "launch.log"),
            "--json",
            "--",
            "python3",
            "-m",
            "sglang.launch_server",
            *S01_ARGS,
            "0.93",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["calibration"]["source"] == "calibrated"
    assert doc["calibration"]["label"] == (
        "calibrated from launch.log: 72.42 GiB of weights per rank"
    )
    assert doc["device_kv_tokens_per_rank"] == pytest.approx(238_007, rel=0.01)
    assert any("calibrated from launch.log" in line for line in doc["lines"])
    bad = tmp_path / "empty.log"
    bad.write_text("nothing here\n")
    refused = subprocess.run(
        [sys.executable, "manage.py", "budget", "--node", str(node), "--calibrate-from", str(bad)]
        + ["--", "python3", "-m", "sglang.launch_server", *S01_ARGS, "0.93"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "--calibrate-from" in refused.stderr


@pytest.mark.django_db
def test_a_pasted_log_calibrates_its_own_profile_until_an_admin_promotes_it(client):
    """Anyone may paste anything: a pasted log calibrates the paster's profile only (one team's
    paste must not loosen another team's checks, D1), until an admin applies it to all."""
    node = _s01_node()
    Gpu.objects.filter(node=node).update(
        name="NVIDIA RTX PRO 6000 Blackwell Server Edition", memory_total_bytes=102_641_958_912
    )
    revision = _s01_revision(node)
    config = json.dumps(json.loads((S01 / "facts.json").read_text())["model_config"])
    args = [*S01_ARGS, "0.93"]
    model = model_facts.model_facts(node, "", config)
    before = profiles.evaluate(args, node, model, profile="kimi")
    assert before.calibration["source"] == "estimate"  # no checkpoint size: weights unknown
    flags = parse_command(args, table("0.5.9"))
    found = calibrations.record_log(
        (S01 / "launch.log").read_text().splitlines(),
        node=node,
        flags=flags,
        profile=revision.profile,
        actor="alice",
        checkpoint_bytes=595_000_000_000,
    )
    after = profiles.evaluate(args, node, model, profile="kimi")
    assert after.calibration["source"] == "calibrated"
    assert after.calibration["label"] == (
        "calibrated from a log pasted by alice: 72.42 GiB of weights per rank"
    )
    assert after.device_kv_tokens_per_rank == pytest.approx(238_007, rel=0.01)
    # Another profile of the same model, or a command of no profile, is not calibrated by it.
    for other in ("kimi-elsewhere", None):
        assert profiles.evaluate(args, node, model, profile=other).calibration["source"] == (
            "estimate"
        )
    # Another TP size, or another GPU model, is not calibrated by it either.
    other_tp = profiles.evaluate([*args[:3], "4", *args[4:]], node, model, profile="kimi")
    assert other_tp.calibration["source"] != "calibrated"

    # An operator cannot promote it; an admin can, audited; then it calibrates everyone's.
    client.force_login(make_user("olga", "operator"))
    url = f"/calibrations/{found.pk}/promote/"
    assert client.post(url).status_code == 403
    client.force_login(make_user("ada", "admin"))
    page = client.get(f"/launch-profiles/{revision.profile.pk}/").content.decode()
    assert "this profile" in page and "Apply to every profile" in page
    assert client.post(url, follow=True).status_code == 200
    assert AuditEntry.objects.filter(action="calibration.promote", actor_name="ada").exists()
    assert profiles.evaluate(args, node, model).calibration["source"] == "calibrated"
    page = client.get(f"/launch-profiles/{revision.profile.pk}/").content.decode()
    assert "every profile" in page and "Apply to every profile" not in page


@pytest.mark.django_db
def test_a_pasted_log_the_checkpoint_makes_impossible_is_refused_with_the_reason(
    operator_client,
):
    """D1: "mem usage=0.10 GB" for llama-3-70b at TP1 (its tensors about 131 GiB) turned a
    blocked check into ok. The panel knows the checkpoint; figures it rules out are refused."""
    node = make_node("gpu-01", host_key=KEY, sglang_version="0.5.9")
    Gpu.objects.filter(node=node).update(memory_total_bytes=80 * GiB)
    path = "/srv/models/llama-3-70b"
    ModelReading.objects.create(
        node=node, model_path=path, host=node.host, read_at=timezone.now(),
        answer={"config": MODELS["llama-3-70b"]["config"], "weights_bytes": 141 * 10**9},
    )  # fmt: skip
    profile = LaunchProfile.objects.create(name="llama-tp1", created_by="bob")
    ProfileRevision.objects.create(
        profile=profile, number=1, args=["--model-path", path], env={}, author="bob", node=node,
        verdict="block", report={},
    )  # fmt: skip
    log = [
        f"server_args=ServerArgs(model_path='{path}', tp_size=1, port=30000)",
        "[2026-12-04 10:00:00] Load weight begin. avail mem=78.00 GB",
        "[2026-12-04 10:00:09] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, "
        "avail mem=77.90 GB, mem usage=0.10 GB.",
        "[2026-12-04 10:00:10] KV Cache is allocated. #tokens: 900000, K size: 30 GB",
    ]
    page = operator_client.post(
        f"/launch-profiles/{profile.pk}/calibrate/", {"log": "\n".join(log)}, follow=True
    ).content.decode()
    assert "That log cannot calibrate: the log says 0.10 GiB of weights per rank" in page
    assert "the checkpoint&#x27;s tensors are 131.32 GiB" in page
    assert not Calibration.objects.exists()


def test_plausibility_is_checked_against_the_gpu_and_the_memory_the_weights_loaded_into():
    from nodes.domain.calibration import check_plausible

    figures = parse(
        [
            "[t TP0] Load weight begin. avail mem=90.00 GB",
            "[t TP0] Load weight end. type=X, avail mem=75.00 GB, mem usage=15.00 GB.",
        ]
    )
    with pytest.raises(CalibrationError, match="more than the 80.00 GiB the GPU has"):
        check_plausible(figures, checkpoint_bytes=None, ranks=1, gpu_memory_bytes=80 * GiB)
    # A 16-bit checkpoint of 30 GiB over two ranks: 15 GiB each is right, fp8 on load too.
    assert check_plausible(figures, checkpoint_bytes=30 * GiB, ranks=2, gpu_memory_bytes=None) == [
        "the GPU's memory is not known"
    ]
    check_plausible(figures, checkpoint_bytes=60 * GiB, ranks=2, gpu_memory_bytes=141 * GiB)
    with pytest.raises(CalibrationError, match="not 0.125 times"):
        check_plausible(figures, checkpoint_bytes=240 * GiB, ranks=2, gpu_memory_bytes=None)
    unknown = check_plausible(figures, checkpoint_bytes=None, ranks=2, gpu_memory_bytes=None)
    assert "the checkpoint's size is not known" in unknown
    heavy = parse(
        [
            "[t TP0] Load weight begin. avail mem=10.00 GB",
            "[t TP0] Load weight end. type=X, avail mem=1.00 GB, mem usage=15.00 GB.",
        ]
    )
    with pytest.raises(CalibrationError, match="cannot hold them"):
        check_plausible(heavy, checkpoint_bytes=None, ranks=1, gpu_memory_bytes=None)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("node_name", "model", "tp"),
    [
        ("spare", "qwen2.5-7b", 2),
        ("incident", "qwen3-next-80b-a3b", 4),  # hybrid: a state pool shares the rest
    ],
)
def test_a_first_launch_calibrates_the_next_estimate(
    sim_fleet, launch_workers, node_name, model, tp
):
    sim = sim_fleet[node_name]
    sim.make_clean()
    node = register_sim_node(sim)
    discovery.discover(node.pk)
    node.refresh_from_db()
    path = f"/srv/models/{model}"
    command = f"python3 -m sglang.launch_server --model-path {path} --tp-size {tp}"
    olga = make_user("olga", "operator")
    launch = launching.submit(node=node, command=command, actor=olga)
    wait_until(
        lambda: (
            Launch.objects.get(pk=launch.pk).status
            in (LaunchStatus.READY, LaunchStatus.FAILED, LaunchStatus.BLOCKED)
        ),
        180,
        0.3,
    )
    launch.refresh_from_db()
    assert launch.status == LaunchStatus.READY, (launch.reason, launch.checks)
    # Stored by the follower right after the launch turned ready (not in the same transaction).
    wait_until(lambda: Calibration.objects.filter(launch=launch).exists(), 30, 0.2)
    stored = Calibration.objects.get(launch=launch)
    assert stored.weights_per_rank_bytes == round(launch.progress["numbers"]["weights_gib"] * GiB)
    assert stored.tp_size == tp and stored.node_name == node.name
    served = launch.server_info["max_total_num_tokens"]
    # Before calibration the estimate came from the safetensors headers, not from a guess.
    assert launch.estimate["calibration"]["weights"] == "estimate"
    assert launch.estimate["device_kv_tokens_per_rank"] == pytest.approx(served, rel=0.05)
    ending.stop(launch.pk, actor=olga)
    wait_until(lambda: Launch.objects.get(pk=launch.pk).status == LaunchStatus.STOPPED, 60, 0.3)
    discovery.discover(node.pk)
    node.refresh_from_db()
    args = command.split()[3:]
    report = profiles.evaluate(args, node, model_facts.model_facts(node, path))
    assert report.calibration["source"] == "calibrated"
    assert report.calibration["label"].startswith(
        f"calibrated from launch #{launch.pk} on {node.name}: "
    )
    assert report.device_kv_tokens_per_rank == pytest.approx(served, rel=0.01)


def _s01_node() -> Node:
    """Case S01's node (8 RTX PRO 6000, SGLang 0.5.9) with its model read there a week ago:
    config.json and the checkpoint's 595 GB of tensors, what a pasted log is checked against."""
    node = make_node("node-b", sglang_version="0.5.9", host_key=KEY)
    Gpu.objects.filter(node=node).update(
        name="NVIDIA RTX PRO 6000 Blackwell Server Edition", memory_total_bytes=102_641_958_912
    )
    facts = json.loads((S01 / "facts.json").read_text())
    ModelReading.objects.create(
        node=node, model_path=S01_ARGS[1], host=node.host,
        read_at=timezone.now() - timedelta(days=6),
        answer={"config": facts["model_config"], "weights_bytes": facts["model_weights_bytes"]},
    )  # fmt: skip
    return node


@pytest.mark.django_db
def _s01_revision(node):
    """Case S01's command (Kimi at ``--mem-fraction-static 0.93``) saved as profile ``kimi`` on
    ``node`` by operator owen, checked against the case's model config."""
    config = json.dumps(json.loads((S01 / "facts.json").read_text())["model_config"])
    args = [*S01_ARGS, "0.93"]
    model = model_facts.model_facts(node, "", config)
    return profiles.save_revision(
        profile_name="kimi",
        args=args,
        env={},
        message="",
        node=node,
        report=profiles.evaluate(args, node, model),
        model=model,
        actor=make_user("owen", None),
    )


def test_the_profile_page_takes_a_pasted_log_and_shows_estimate_vs_observed(operator_client):
    node = _s01_node()
    Gpu.objects.filter(node=node).update(
        name="NVIDIA RTX PRO 6000 Blackwell Server Edition", memory_total_bytes=102_641_958_912
    )
    revision = _s01_revision(node)
    url = f"/launch-profiles/{revision.profile.pk}/calibrate/"
    refused = operator_client.post(url, {"log": "no weight lines here"}, follow=True)
    assert b"That log cannot calibrate" in refused.content
    assert not Calibration.objects.exists()
    page = operator_client.post(url, {"log": (S01 / "launch.log").read_text()}, follow=True)
    assert page.status_code == 200
    text = page.content.decode()
    assert "calibrated from a log pasted by" in text and "72.42 GiB of weights per rank" in text
    stored = Calibration.objects.get()
    assert stored.profile == revision.profile and stored.kv_tokens == 238_007
    table_html = text[text.find("Calibration from") :]
    assert "238007" in table_html.replace(",", "") and "+0.0 %" not in table_html


@pytest.mark.parametrize(
    ("swap", "said"),
    [
        (("avail mem=", "avail mem=1.2.3"), "avail mem=1.2.3"),
        (("avail mem=", "avail mem=" + "9" * 30), "avail mem=999"),
        (("mem usage=", "mem usage=" + "7" * 20), "mem usage=777"),
        (("#tokens: ", "#tokens: " + "8" * 26), "#tokens=888"),
    ],
)
def test_a_pasted_log_with_impossible_figures_is_refused_with_the_figure_named(
    operator_client, swap, said
):
    """Found by an adversarial pass: these were 500 pages (a float that is no number, an
    integer too big for the database). Each figure is a decimal within what a GPU holds."""
    revision = _s01_revision(_s01_node())
    log = (S01 / "launch.log").read_text()
    old, new = swap
    assert old in log
    pasted = log.replace(old, new)
    url = f"/launch-profiles/{revision.profile.pk}/calibrate/"
    page = operator_client.post(url, {"log": pasted}, follow=True)
    assert page.status_code == 200
    assert "That log cannot calibrate: " + said in page.content.decode()
    assert not Calibration.objects.exists()


def test_a_log_of_another_model_or_tp_size_does_not_calibrate(tmp_path):
    from nodes.domain.calibration import check_fits

    args = "server_args=ServerArgs(model_path='/srv/models/qwen2.5-7b', tp_size=1, port=30000)"
    figures = parse(
        [
            args,
            "[t TP0] Load weight begin. avail mem=90.00 GB",
            "[t TP0] Load weight end. type=X, avail mem=75.00 GB, mem usage=14.77 GB.",
        ]
    )
    with pytest.raises(CalibrationError, match="TP1, not TP4"):
        check_fits(figures, "/srv/models/llama-3-70b", 4)
    with pytest.raises(CalibrationError, match="not /srv/models/llama-3-70b"):
        check_fits(figures, "/srv/models/llama-3-70b", 1)
    check_fits(figures, "/other/place/Qwen2.5-7B/", 1)  # the same model elsewhere calibrates
    # The budget command refuses it as input (exit 2) and says why.
    log, node = tmp_path / "qwen.log", tmp_path / "node.json"
    log.write_text(
        "\n".join(
            [
                args,
                *(
                    f"[t TP0] {x}"
                    for x in (
                        "Load weight begin. avail mem=90.00 GB",
                        "Load weight end. type=X, avail mem=75.00 GB, mem usage=14.77 GB.",
                    )
                ),
            ]
        )
        + "\n"
    )  # noqa: E501
    node.write_text(json.dumps(json.loads((S01 / "facts.json").read_text())["node"]))
    refused = subprocess.run(
        [sys.executable, "manage.py", "budget", "--node", str(node), "--calibrate-from", str(log)]
        + ["--", "python3", "-m", "sglang.launch_server", *S01_ARGS, "0.93"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "TP1, not TP8" in refused.stderr, refused.stderr


def test_a_run_under_other_kv_settings_is_not_compared_with_the_estimate(operator_client):
    """Found by a newcomer: a launch with the automatic KV dtype against an fp8 revision's
    estimate, shown as "+100.0 %". Token counts under other pool settings measure nothing."""
    node = _s01_node()
    Gpu.objects.filter(node=node).update(
        name="NVIDIA RTX PRO 6000 Blackwell Server Edition", memory_total_bytes=102_641_958_912
    )
    revision = _s01_revision(node)
    revision.args = [*revision.args, "--kv-cache-dtype", "fp8_e5m2"]
    revision.save(update_fields=["args"])
    args_line = (
        "[2026-01-01 00:00:10] server_args=ServerArgs(model_path='/models/kimi-k2.5-int4', "
        "kv_cache_dtype='auto', mem_fraction_static=0.93, max_total_tokens=None, tp_size=8)\n"
    )
    log = args_line + (S01 / "launch.log").read_text()
    url = f"/launch-profiles/{revision.profile.pk}/calibrate/"
    page = operator_client.post(url, {"log": log}, follow=True).content.decode()
    assert Calibration.objects.get().pool_settings["kv_cache_dtype"] == "auto"
    table = html.unescape(page[page.find("Calibration from") :])
    assert "not compared: it ran with --kv-cache-dtype auto, this revision fp8_e5m2" in table
    assert "+100.0 %" not in table and "-50.0 %" not in table


@pytest.mark.django_db
def test_model_readings_not_asked_for_in_a_week_are_pruned():
    from datetime import timedelta

    from nodes.services.model_facts import prune

    node = make_node("gpu-01", host_key=KEY)
    now = timezone.now()
    for path, read in (("/old", now - timedelta(days=8)), ("/recent", now - timedelta(days=2))):
        ModelReading.objects.create(node=node, model_path=path, host=node.host, read_at=read)
    # Asked for again lately (a read queued), even if the last answer is old: kept.
    ModelReading.objects.create(
        node=node, model_path="/asked", host=node.host, read_at=now - timedelta(days=30),
        requested_at=now - timedelta(minutes=1),
    )  # fmt: skip
    assert prune() == 1
    assert sorted(ModelReading.objects.values_list("model_path", flat=True)) == [
        "/asked",
        "/recent",
    ]


@pytest.mark.parametrize(
    "repeated",
    ["server_args=ServerArgs(", "Load weight end.", "[TP1 ", "KV Cache is allocated. dtype: x"],
)
def test_a_pasted_log_built_to_make_the_parser_crawl_is_read_in_bounded_time(repeated):
    """Found by an attacker: ``server_args=ServerArgs(`` repeated in a 368 KB paste kept the
    web process busy for minutes (a lazy ``.*?`` tried again from every occurrence). Each line
    now costs bounded time; the whole 4 MB a paste may hold reads in well under a second here,
    and the bound below leaves a slow machine twentyfold room."""
    import time

    hostile = repeated * (4_000_000 // len(repeated))
    lines = [
        hostile,
        "[t TP0] Load weight begin. avail mem=78.00 GB",
        "[t TP0] Load weight end. type=X, avail mem=60.00 GB, mem usage=18.00 GB.",
    ]
    started = time.monotonic()
    figures = parse(lines)
    pool_settings_in(lines)
    assert time.monotonic() - started < 5.0
    assert figures.weights_per_rank_bytes == 18 * GiB


@pytest.mark.django_db
def test_figures_nothing_can_check_are_refused_and_stored_ones_are_checked_at_every_use(client):
    """Found by an attacker: with the model's reading stale or missing, a pasted 0.10 GiB for a
    70B model was taken, kept being used once the checkpoint was known, and an admin's promote
    spread it to every profile; and naming another team's hidden profile in the check brought
    its pasted figures (and who pasted them) in."""
    from nodes.models import Team
    from tests.factories import profile_form_data

    node = make_node("gpu-01", host_key=KEY, sglang_version="0.5.9")
    Gpu.objects.filter(node=node).update(name="NVIDIA H100", memory_total_bytes=80 * GiB)
    path = "/srv/models/llama-3-70b"
    args = ["--model-path", path, "--tp-size", "1"]
    profile = LaunchProfile.objects.create(name="llama-tp1", created_by="bob")
    ProfileRevision.objects.create(
        profile=profile, number=1, args=args, env={}, author="bob", node=node, verdict="block",
        report={},
    )  # fmt: skip
    log = "\n".join(
        [
            "[t TP0] Load weight begin. avail mem=78.00 GB",
            "[t TP0] Load weight end. type=X, avail mem=77.90 GB, mem usage=0.10 GB.",
        ]
    )
    client.force_login(make_user("bob", "operator"))
    page = client.post(f"/launch-profiles/{profile.pk}/calibrate/", {"log": log}, follow=True)
    assert "has not been read on gpu-01 yet" in page.content.decode()
    assert not Calibration.objects.exists()

    # One stored before the checkpoint was known (as an older panel stored them), promoted.
    poisoned = Calibration.objects.create(
        model_path=path, gpu_name="NVIDIA H100", tp_size=1, node=node, profile=profile,
        source="a log pasted by bob", free_before_load_bytes=78 * GiB,
        weights_per_rank_bytes=GiB // 10, promoted_at=timezone.now(),
    )  # fmt: skip
    ModelReading.objects.create(
        node=node, model_path=path, host=node.host, read_at=timezone.now() - timedelta(days=3),
        answer={"config": MODELS["llama-3-70b"]["config"], "weights_bytes": 141 * 10**9},
    )  # fmt: skip
    known = model_facts.model_facts(node, path, wait=0)
    assert profiles.evaluate(args, node, known).calibration["source"] != "calibrated"
    # An admin's promote checks again.
    Calibration.objects.filter(pk=poisoned.pk).update(promoted_at=None)
    client.force_login(make_user("ada", "admin"))
    page = client.post(f"/calibrations/{poisoned.pk}/promote/", follow=True).content.decode()
    assert "Not applied to every profile: the log says 0.10 GiB of weights per rank" in page
    assert Calibration.objects.get(pk=poisoned.pk).promoted_at is None

    # A possible one of a team-only profile does not reach an outsider naming that profile.
    Calibration.objects.all().delete()
    alpha = Team.objects.create(name="alpha")
    LaunchProfile.objects.filter(pk=profile.pk).update(
        team=alpha, visibility=LaunchProfile.Visibility.TEAM
    )
    Calibration.objects.create(
        model_path=path, gpu_name="NVIDIA H100", tp_size=1, node=node, profile=profile,
        source="a log pasted by bob", free_before_load_bytes=78 * GiB,
        weights_per_rank_bytes=131 * GiB,
    )  # fmt: skip
    client.force_login(make_user("eve", "operator"))
    data = profile_form_data(node, name="llama-tp1", model_path=path, tp_size="1")
    body = client.post("/launch-profiles/check/", data).content.decode()
    assert "pasted by bob" not in body and "calibrated from" not in body


def test_a_log_naming_ranks_its_server_has_not_or_an_empty_pool_reads_as_it_should():
    from nodes.domain.calibration import check_fits

    lines = [
        "[t TP0] Load weight begin. avail mem=78.00 GB",
        "[t TP0] Load weight end. type=X, avail mem=60.00 GB, mem usage=18.00 GB.",
        "[t TP5] Load weight begin. avail mem=78.00 GB",
        "max_total_num_tokens=-5, chunked_prefill_size=8192",
    ]
    figures = parse(lines)
    assert figures.kv_tokens is None  # no pool of -5 tokens
    with pytest.raises(CalibrationError, match="names rank TP5, which a TP1 server has not"):
        check_fits(figures, "/m", 1)
    check_fits(figures, "/m", 8)


@pytest.mark.django_db
def test_a_pasted_log_up_to_its_4_mb_is_read_not_refused_by_the_request_size(operator_client):
    """Django's own 2.5 MB form limit answered a 3 MB paste with a bare 400."""
    revision = _s01_revision(_s01_node())
    log = (S01 / "launch.log").read_text() + ("[t TP0] padding line\n" * 150_000)
    assert 3_000_000 < len(log) < 4_000_000
    url = f"/launch-profiles/{revision.profile.pk}/calibrate/"
    page = operator_client.post(url, {"log": log}, follow=True)
    assert page.status_code == 200 and Calibration.objects.count() == 1
