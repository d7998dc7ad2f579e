"""Notes read as a person reads them: what a sentence asserts is kept, a mention that asserts
nothing (negated, asked, supposed, a to-do) is dropped."""

from __future__ import annotations

import pytest

from nodes.domain.diagnosis.plain_words import asserted


@pytest.mark.parametrize(
    "note",
    [
        "No OOMKilled flag was collected.",
        "The container was not OOMKilled.",
        "dmesg shows no 'Out of memory: Killed process' line",
        "Nothing in the kernel log says out of memory.",
        "OOMKilled?",
        "Checklist: OOMKilled? Killed process in dmesg? EADDRINUSE on the ports?",
        "If the port had been taken, the log would say EADDRINUSE.",
        "Check for Killed process lines in dmesg before the retry.",
        "Whether the kernel killed anything could not be confirmed.",
    ],
)
def test_a_mention_that_asserts_nothing_is_dropped(note):
    assert asserted(note) == ""


@pytest.mark.parametrize(
    ("note", "kept"),
    [
        (
            "Out of memory: Killed process 4242 (sglang::schedul) total-vm:1kB",
            "Out of memory: Killed process 4242 (sglang::schedul) total-vm:1kB",
        ),
        (
            "panel: sglang::scheduler_TP2 (PID 5121) died while serving",
            "panel: sglang::scheduler_TP2 (PID 5121) died while serving",
        ),
        (
            "kubectl describe pod: Reason: OOMKilled, Exit Code: 137",
            "kubectl describe pod: Reason: OOMKilled, Exit Code: 137",
        ),
        ("The pod was OOMKilled, but no core dump was written.", "The pod was OOMKilled"),
        (
            "No OOMKilled reason was reported; the kernel log shows Killed process 12.",
            "the kernel log shows Killed process 12.",
        ),
        ("MemAvailable fell to 1.5 GB at 10:04.", "MemAvailable fell to 1.5 GB at 10:04."),
    ],
)
def test_what_a_note_asserts_is_kept(note, kept):
    assert asserted(note) == kept
