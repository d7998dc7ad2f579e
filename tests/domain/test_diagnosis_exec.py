"""A server whose program never ran (``execve`` refused it) is diagnosed by the errno the
starter printed, whoever printed it, and not by a shell's complaint about a helper."""

from __future__ import annotations

import pytest

from nodes.domain.diagnosis import diagnose
from nodes.domain.env_policy import env_sizes

BIG = {"MODEL_NOTES": "x" * 2_000_000, "HF_TOKEN": "hf_short"}


def facts(code: int | None, env: dict[str, str] | None = None) -> dict:
    return {
        "exit": {"code": code},
        "env": {name: "****" for name in env or {}},  # masked, as bundles carry it
        "extra": env_sizes(env or {}),
    }


@pytest.mark.parametrize(
    "line",
    [
        "rankwise: cannot start /opt/venv/bin/python3: [Errno 7] Argument list too long: "
        "'/opt/venv/bin/python3'",
        "bash: line 1: /usr/bin/python3: Argument list too long",
        "exec /usr/bin/python3: argument list too long",
        "OSError: [Errno 7] Argument list too long: 'python3'",
    ],
)
def test_an_environment_too_long_for_execve_is_named_by_its_words(line):
    found = diagnose(line + "\n", facts(127, BIG), {}).to_json()
    assert found["category"] == "exec-failed", found
    assert "too long" in found["summary"] and "E2BIG" in found["summary"]
    # The variable is named with its size (it is what to change), its value never.
    assert "MODEL_NOTES alone is 2,000,013 bytes" in found["summary"]
    assert "MODEL_NOTES" in found["remedy"] and "xxxx" not in str(found)
    assert "HF_TOKEN" not in str(found)  # a short secret's length is not told
    assert found["numbers"]["largest_variable_bytes"] == 2_000_013
    assert found["evidence"][0]["line"] == 1


def test_without_the_sizes_it_still_says_what_to_shorten():
    found = diagnose("sh: 1: exec: python3: Argument list too long\n", facts(126), {})
    assert found.category == "exec-failed"
    assert "131,072" in found.remedy and "python3" in found.summary


@pytest.mark.parametrize(
    ("line", "code", "said"),
    [
        (
            "rankwise: cannot start /opt/nowhere/python: [Errno 2] No such file or directory: "
            "'/opt/nowhere/python'",
            127,
            "/opt/nowhere/python does not exist on the node",
        ),
        ("bash: line 1: /opt/env/bin/python: Permission denied", 126, "not executable"),
        ("sh: 1: python3: not found", 127, "python3 does not exist on the node"),
        (
            "/bin/sh: /opt/env/bin/python: cannot execute binary file: Exec format error",
            126,
            "not a program this node can run",
        ),
    ],
)
def test_an_interpreter_that_cannot_run_says_which_and_why(line, code, said):
    found = diagnose(line + "\n", facts(code), {})
    assert found.category == "exec-failed", found
    assert said in found.summary and "interpreter" in found.remedy


def test_a_shell_complaint_about_a_helper_while_the_server_ran_is_not_it():
    log = (
        "sh: 1: nvcc: not found\n"
        "[2026-12-01 10:00:00 TP0] Load weight begin. avail mem=139.20 GB\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 139.81 GiB of which 1.20 GiB is free.\n"
    )
    assert diagnose(log, facts(1), {}).category != "exec-failed"
