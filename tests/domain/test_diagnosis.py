"""The diagnosis engine on the case corpus and on cases written from SGLang's log formats.

Issue 7 is in progress: the corpus test covers the categories whose rules have landed and grows
with each new rule until every case folder is covered.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nodes.domain.diagnosis import diagnose
from nodes.domain.sglang_flags import parse_command, split_command
from nodes.flag_tables import table

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "cases"
# The corpus cases whose rules have landed (issue 7 in progress).
LANDED = {
    *("C02", "C05", "C08", "C09", "C15", "C16", "C18", "C19", "C20", "C23", "C25", "C26"),
    *("C13", "C14", "C24", "C30", "S01", "S02"),
}


def flags_of(facts: dict) -> dict:
    argv, _ = split_command(list(facts.get("command") or []))
    return parse_command(argv, table(facts.get("engine_version") or "0.5.9")).values


def run(case: Path):
    facts = json.loads((case / "facts.json").read_text())
    return diagnose((case / "launch.log").read_text(), facts, flags_of(facts))


def states(summary: str, value: float | str | list) -> bool:
    """The summary names ``value`` (as printed, rounded the way a person would)."""
    if isinstance(value, list):
        return all(states(summary, v) for v in value)
    if isinstance(value, str):
        return value in summary
    shown = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", summary)]
    return any(abs(n - value) <= max(0.011, abs(value) * 0.001) for n in shown)


def corpus() -> list[str]:
    landed = []
    for case in sorted(p for p in CASES.iterdir() if p.is_dir()):
        if case.name in LANDED:
            landed.append(case.name)
    return landed


@pytest.mark.parametrize("name", corpus())
def test_corpus_cases_get_their_category_numbers_and_fix(name):
    expected = json.loads((CASES / name / "expected.json").read_text())
    found = run(CASES / name)
    assert found.category == expected["category"], found.summary
    missing = [k for k, v in expected["key_numbers"].items() if not states(found.summary, v)]
    assert not missing, (missing, found.summary)
    assert any(k.lower() in found.remedy.lower() for k in expected["remedy_keywords"]), found.remedy
    assert found.evidence and all(e.line for e in found.evidence if e.source == "log")


@pytest.mark.parametrize("name", corpus())
def test_without_the_signatures_a_case_is_unknown_not_wrong(name):
    expected = json.loads((CASES / name / "expected.json").read_text())
    facts = json.loads((CASES / name / "facts.json").read_text())
    log = (CASES / name / "launch.log").read_text()
    for signature in expected.get("signatures", []):
        log = "\n".join(line for line in log.splitlines() if signature not in line)
    assert diagnose(log, facts, flags_of(facts)).category in ("unknown", expected["category"])


def test_a_precheck_of_another_size_on_0_5_12_is_read_the_same_way():
    log = (
        "[2026-03-01 10:00:00 TP2] Scheduler hit an exception: Traceback (most recent call "
        "last):\nValueError: Not enough host memory available. Requesting 120.50 GB but only "
        "have 98.20 GB free. Please reduce the size of the hierarchical cache.\n"
    )
    found = diagnose(log, {"engine_version": "0.5.12"}, {})
    assert found.category == "host-mem-precheck"
    assert found.numbers["effective_free_gb"] == 87.46 and found.numbers["shortfall_gb"] == 33.04
    assert found.evidence[0].line == 2


def test_an_empty_log_is_unknown_and_says_what_would_help():
    found = diagnose("", {}, {})
    assert found.category == "unknown" and "dmesg" in found.remedy
    assert set(found.to_json()) == {
        "category",
        "secondary_categories",
        "summary",
        "evidence",
        "remedy",
        "numbers",
    }


def test_a_busy_nccl_port_with_its_holder_in_the_snapshot():
    log = (
        "[2026-05-02 08:00:00] server_args=ServerArgs(port=31000, ...)\n"
        "ValueError: nccl_port at 31417 is not available in 60 seconds. nccl_port is used by a "
        "process already.\n"
    )
    facts = {
        "snapshots": [
            {
                "phase": "after_failure",
                "listening_ports": [{"port": 31417, "pid": 777}],
                "processes": [{"pid": 777, "ppid": 1, "cmdline": "sglang::scheduler_TP1"}],
            }
        ]
    }
    found = diagnose(log, facts, {})
    assert (
        found.category == "port-in-use" and "defunct-zombie-process" in found.secondary_categories
    )
    assert found.numbers == {"port": 31417, "wait_seconds": 60, "holder_pid": 777}


def test_an_unbalanced_gpu_in_0_5_23_wording():
    log = (
        "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other "
        "processes. min_per_gpu_memory=60.125, local_gpu_memory=139.5, local_gpu_memory * "
        "0.9=125.55\n"
    )
    found = diagnose(log, {}, {})
    assert found.category == "gpu-occupied-by-other-process"
    assert "60.12 GB vs 139.50 GB" in found.summary or "60.13 GB vs 139.50 GB" in found.summary


def test_no_corpus_case_gets_a_wrong_category():
    wrong = {}
    for case in sorted(p for p in CASES.iterdir() if p.is_dir()):
        expected = json.loads((case / "expected.json").read_text())["category"]
        found = run(case).category
        if found not in (expected, "unknown"):
            wrong[case.name] = (expected, found)
    assert not wrong
