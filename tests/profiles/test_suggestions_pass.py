"""Every change the budget suggests is complete: the command with it applied passes
``manage.py budget`` (exit 0, ok or warn) on the same node, whatever the node, model, version
and sizes. The form's *Apply* button, a failed launch's *Suggested change*, a clone and
``manage.py diagnose --json``'s ``change`` all take this suggestion."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodes.domain import remedy
from nodes.domain.budget import BudgetReport, NodeMemory, check
from nodes.domain.geometry import from_config
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import table
from tests.domain.test_budget import KIMI, LLAMA_70B

GB, GiB = 10**9, 2**30
MODELS = {"kimi": (KIMI, 595 * GB), "llama": (LLAMA_70B, 141 * GB)}
VERSIONS = ("0.4.10.post2", "0.5.2", "0.5.9", "0.5.23")


def _suggested(
    argv: list[str], gpus: tuple[int, ...], ram: int, available: int, model: str, version: str
) -> BudgetReport:
    config, weights = MODELS[model]
    node = NodeMemory(tuple(gpus), ram, mem_available_bytes=available)
    report = check(
        parse_command(argv, table(version)),
        node,
        version=version,
        geometry=from_config(config),
        weights_bytes=weights,
    )
    return report


def _budget_cli(tmp: Path, argv, gpus, ram, available, model, version) -> tuple[int, dict]:
    """``manage.py budget --json`` on the same node: its exit status and report."""
    config, weights = MODELS[model]
    node = tmp / "node.json"
    node.write_text(
        json.dumps(
            {
                "host_ram_bytes": ram,
                "mem_available_bytes": available,
                "gpus": [{"memory_total_bytes": g} for g in gpus],
            }
        )
    )
    (tmp / "config.json").write_text(json.dumps(config))
    out = io.StringIO()
    try:
        call_command(
            "budget",
            "--node",
            str(node),
            "--model-config",
            str(tmp / "config.json"),
            "--weights-bytes",
            str(weights),
            "--sglang-version",
            version,
            "--json",
            "--",
            "python3",
            "-m",
            "sglang.launch_server",
            *argv,
            stdout=out,
        )
        status = 0
    except SystemExit as exc:
        status = int(exc.code or 0)
    return status, json.loads(out.getvalue())


def _command(model: str, tp: int, mfs: float, hicache: int) -> list[str]:
    argv = ["--model-path", f"/srv/models/{model}", "--tp-size", str(tp)]
    argv += ["--mem-fraction-static", str(mfs)]
    if hicache:
        argv += ["--enable-hierarchical-cache", "--hicache-size", str(hicache)]
    return argv


def test_the_issues_case_suggests_both_flags_and_they_pass(tmp_path):
    """The incident on 141 GiB H200s with SGLang 0.5.9: 37 GB per rank alone is blocked (the
    host pool must hold more tokens than the device pool at 0.93), so the change has both."""
    gpus, ram, available = (141 * GiB,) * 8, 449 * GB, 433 * GB
    argv = _command("kimi", 8, 0.93, 300)
    report = _suggested(argv, gpus, ram, available, "kimi", "0.5.9")
    assert report.verdict == "block"
    suggestion = report.suggestion or {}
    assert set(suggestion) == {"--hicache-size", "--mem-fraction-static"}
    assert suggestion["--hicache-size"] == 37
    alone = remedy.with_changes(argv, {"--hicache-size": 37}, table("0.5.9"))
    assert _budget_cli(tmp_path, alone, gpus, ram, available, "kimi", "0.5.9")[0] == 1
    changed = remedy.with_changes(argv, suggestion, table("0.5.9"))
    status, doc = _budget_cli(tmp_path, changed, gpus, ram, available, "kimi", "0.5.9")
    assert status == 0 and doc["verdict"] == report.suggestion_verdict


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    model=st.sampled_from(sorted(MODELS)),
    version=st.sampled_from(VERSIONS),
    gpu_gib=st.sampled_from([24, 48, 80, 96, 141, 192]),
    tp=st.sampled_from([1, 2, 4, 8]),
    mfs=st.sampled_from([0.5, 0.7, 0.8, 0.85, 0.88, 0.9, 0.93, 0.95]),
    hicache=st.sampled_from([0, 5, 20, 37, 52, 100, 300, 1000]),
    ram_gb=st.sampled_from([128, 256, 449, 1024, 2048]),
    used_gb=st.sampled_from([0, 20, 100]),
)
def test_every_suggestion_passes_manage_py_budget(
    tmp_path, model, version, gpu_gib, tp, mfs, hicache, ram_gb, used_gb
):
    gpus = (gpu_gib * GiB,) * 8
    ram, available = ram_gb * GB, max(ram_gb - used_gb, 1) * GB
    argv = _command(model, tp, mfs, hicache)
    report = _suggested(argv, gpus, ram, available, model, version)
    if not report.suggestion:
        return
    changed = remedy.with_changes(argv, report.suggestion, table(version))
    status, doc = _budget_cli(tmp_path, changed, gpus, ram, available, model, version)
    blocks = [m["text"] for m in doc["messages"] if m["level"] == "block"]
    assert status == 0 and doc["verdict"] in ("ok", "warn"), (report.suggestion, blocks)
    assert doc["verdict"] == report.suggestion_verdict


@pytest.mark.parametrize("version", VERSIONS)
def test_a_change_that_passes_nowhere_is_not_suggested(version):
    """The weights do not fit these GPUs at any fraction: no flag change is offered."""
    argv = _command("kimi", 1, 0.9, 0)
    report = _suggested(argv, (80 * GiB,) * 8, 1024 * GB, 1000 * GB, "kimi", version)
    assert report.verdict == "block" and report.suggestion is None
