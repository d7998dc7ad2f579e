"""What the log viewer needs to know of one stored line: its level and the rank that wrote it.

SGLang logs through Python's ``logging`` with the format ``[%(asctime)s{prefix}] %(message)s``,
where the prefix names the process's ranks (`` TP3``, `` DP1 TP3``, `` PP0 TP3 EP3``), and prints
no level name (``sglang/srt/utils.py``, ``configure_logger``; the scheduler sets the prefix from
its ranks in ``scheduler.py``). So the level is read from what the line says, the way an operator
scans for trouble: a traceback or an exception, a CUDA or NCCL error, a kill, a failed health
check is an error; a line naming a warning is a warning. The diagnosis's evidence lines are
marked apart (by sequence number), not here.

Also the decode-batch line the scheduler prints every ``--decode-log-interval`` steps (40 by
default), which the viewer collapses into a counted group.
"""

from __future__ import annotations

import re

INFO, WARNING, ERROR = 0, 1, 2
LEVELS = {"info": INFO, "warning": WARNING, "error": ERROR}

#: ``[2026-01-01 00:05:10 DP1 TP3]``: the date, then the ranks (a line of a child process
#: without a prefix, a traceback's frames, NCCL's own lines have none).
_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?((?: [A-Z_]+\d+)+)\]")
_ERROR = re.compile(
    r"Traceback \(most recent call last\)|\b[A-Z]\w*(?:Error|Exception)\b(?:: |$)|"
    r"\bERROR\b|CUDA out of memory|\bOOM\b|NCCL (?:error|WARN)|\bKilled\b|"
    r"Segmentation fault|core dumped|SIGKILL|SIGSEGV|Health check failed|Scheduler hit an "
    r"exception|Rank \d+ scheduler is dead|is dead|Aborted|crashed with exit code|"
    # A traceback's frame (``  File "…", line N, in f``): part of the error it leads to.
    r'^\s+File ".*", line \d+',
)
_WARNING = re.compile(r"\bWARN(?:ING)?\b|\bWarning\b|\bwarning:|\bUserWarning\b|deprecated")
#: The scheduler's decode-batch line (``scheduler_metrics_mixin.log_decode_stats``); SGLang has
#: printed it with a comma and, in older versions, a full stop after ``Decode batch``.
DECODE_BATCH = re.compile(r"\] Decode batch[.,] #running-req: ")


#: A word each pattern's every alternative contains: the follower classifies every line as it
#: streams, and a substring test is many times quicker than the search it spares.
_ERROR_MARKS = (
    *("Traceback", "Error", "Exception", "ERROR", "CUDA out of memory", "OOM", "NCCL"),
    *("Killed", "Segmentation fault", "core dumped", "SIGKILL", "SIGSEGV", "Health check"),
    *("exception", "is dead", "Aborted", "crashed with exit code", 'File "'),
)
_WARNING_MARKS = ("WARN", "Warning", "warning:", "deprecated")


def level_of(text: str) -> int:
    """``ERROR``, ``WARNING`` or ``INFO`` for a stored line (see the module's note)."""
    if any(mark in text for mark in _ERROR_MARKS) and _ERROR.search(text):
        return ERROR
    if any(mark in text for mark in _WARNING_MARKS) and _WARNING.search(text):
        return WARNING
    return INFO


def rank_of(text: str) -> str:
    """The ranks that wrote the line as its prefix names them (``"TP3"``, ``"DP1 TP3"``), or
    ``""`` for a line without SGLang's prefix."""
    match = _PREFIX.match(text)
    return match[1].strip()[:32] if match else ""


def is_decode_batch(text: str) -> bool:
    """True for the scheduler's periodic decode-batch line."""
    return DECODE_BATCH.search(text) is not None


def with_node(text: str, node: str) -> str:
    """A stored line as text outside the viewer (download, CLI, bundle): ``[NODE] text`` for a
    line of a multi-node launch (``node`` names the node that printed it), else ``text``."""
    return f"[{node}] {text}" if node else text
