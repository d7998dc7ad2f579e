"""Levels and ranks of stored lines, read from what SGLang prints (issue 21, the viewer's
filters). Lines are taken from the failure bundles and the reference's log signatures."""

from __future__ import annotations

import pytest

from nodes.domain.log_lines import ERROR, INFO, WARNING, is_decode_batch, level_of, rank_of


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("[2026-01-01 00:05:10 TP0] Load weight end. type=DeepseekV4ForCausalLM", INFO),
        ("Traceback (most recent call last):", ERROR),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", ERROR),
        ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275", ERROR),
        ("[2026-01-01 00:06:00 TP3] Scheduler hit an exception: Traceback", ERROR),
        (
            "[2026-01-01 00:06:00] Rank 0 scheduler is dead. Please check the relevant logs.",
            ERROR,
        ),
        # Found by a new user: a rank killed under a running server, and a traceback's frames,
        # were information, so "errors" showed neither.
        (
            "[2026-01-01 00:06:00] Subprocess scheduler (pid=246) crashed with exit code -9. "
            "Triggering SIGQUIT for cleanup...",
            ERROR,
        ),
        (
            '  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", line 2750,'
            " in run_scheduler_process",
            ERROR,
        ),  # fmt: skip
        ('[2026-01-01 00:05:10 TP0] Loading File "a.safetensors", line 3 of 9', INFO),
        ("/usr/lib/python3/site.py:12: UserWarning: TypedStorage is deprecated.", WARNING),
        ("[2026-01-01 00:05:12 TP0] WARNING: the server runs with --disable-cuda-graph", WARNING),
        ("[2026-01-01 00:05:12 TP0] Decode batch, #running-req: 30, #token: 9000", INFO),
        ("An errorless line about error_rates and Errors_total", INFO),
    ],
)
def test_a_line_is_an_error_a_warning_or_information(line, level):
    assert level_of(line) == level


@pytest.mark.parametrize(
    ("line", "rank"),
    [
        ("[2026-01-01 00:05:10 TP0] Load weight end.", "TP0"),
        ("[2026-01-01 00:05:10 DP1 TP3] Memory pool end.", "DP1 TP3"),
        ("[2026-01-01 00:05:10 PP0 TP3 EP3] Memory pool end.", "PP0 TP3 EP3"),
        ("[2026-01-01 00:05:10] The server is fired up and ready to roll!", ""),
        ('  File "/sglang/srt/managers/scheduler.py", line 10, in run', ""),
    ],
)
def test_the_rank_is_read_from_the_prefix(line, rank):
    assert rank_of(line) == rank


def test_decode_batch_lines_of_old_and_new_versions_are_recognised():
    assert is_decode_batch("[2026-01-01 00:05:10 TP0] Decode batch, #running-req: 46, #token: 1")
    assert is_decode_batch("[2026-01-01 00:05:10 TP0] Decode batch. #running-req: 1, #token: 1")
    assert not is_decode_batch("[2026-01-01 00:05:10 TP0] Prefill batch, #new-seq: 1")
