"""Why a launch failed, from its bundle: the category, a one-line summary with the numbers, the
evidence it rests on (log lines with their numbers, snapshot facts), the remedy, the figures.

Rules are tried in order; each is a small function over the evidence: log signatures (exact
texts SGLang prints, shared/reference/sglang.md §6), the memory arithmetic of the command that
ran, and the node's snapshots. The first rule that recognises the failure names its category
(the immediate cause, as tests/fixtures/cases/FORMAT.md asks). When no rule does, the answer is
``unknown`` with what evidence would settle it, never a guess.

Units: SGLang prints ``avail mem=``/``mem usage=`` in GiB and its host-pool figures in decimal
GB; ``numbers`` keys carry the unit.

Layout: ``evidence`` holds what a rule reads and returns (``Bundle``, ``Diagnosis``) and the
shared log formats; the rules live in modules named for what ran out or failed (``host_memory``
with its ``host_pools`` helpers, ``gpu_memory`` and ``gpu_holders`` with ``pytorch_oom``
for PyTorch's out-of-memory text, ``ports``, ``nccl``,
``launch_settings``, ``startup``, ``runtime``, ``vllm``, ``multinode`` for the nodes
and ranks of a launch over several nodes, ``node_setup`` for a node set up unlike the others:
an interface it lacks, another NCCL); ``engine`` puts them in order
(``RULES``) and runs them (``diagnose``), and holds the one rule that runs the others
(``leaked_after_cleanup``). A rule reads its figures first (a small frozen dataclass, or
``None`` when it does not apply) and words them second, so the arithmetic can be read apart from
the text. No module imports one that imports it, not even inside a function
(tests/domain/test_no_import_cycles.py).
"""

from __future__ import annotations

from nodes.domain.diagnosis.engine import RULES, clean_facts, diagnose, engine_of
from nodes.domain.diagnosis.evidence import Bundle, Diagnosis, Evidence, Log, Rule

__all__ = [
    "RULES",
    "Bundle",
    "Diagnosis",
    "Evidence",
    "Log",
    "Rule",
    "clean_facts",
    "diagnose",
    "engine_of",
]
