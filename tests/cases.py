"""The case bundles the diagnosis is tested on, and how a diagnosis is scored against one.

Two sets, kept apart: ``CORPUS`` (tests/fixtures/cases, copied from shared/cases; the engine was
built on them) and ``HELDOUT`` (tests/fixtures/heldout, written from public threads for issue 18
before the engine was changed for them; their notes.md say where each comes from). A case
folder holds ``launch.log``, ``facts.json``, ``expected.json`` and ``notes.md``
(tests/fixtures/cases/FORMAT.md).
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.core.management import call_command

from nodes.domain.diagnosis import Diagnosis, diagnose
from nodes.services.bundles import bundle_flags

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CORPUS = FIXTURES / "cases"
HELDOUT = FIXTURES / "heldout"


def case_dirs(*roots: Path) -> list[Path]:
    """Every case folder under ``roots`` (default: both sets), by name."""
    found = [p for root in roots or (CORPUS, HELDOUT) if root.is_dir() for p in root.iterdir()]
    return sorted((p for p in found if (p / "expected.json").is_file()), key=lambda p: p.name)


def case_ids(*roots: Path) -> list[str]:
    return [p.name for p in case_dirs(*roots)]


def case_dir(name: str) -> Path:
    """The folder of case ``name`` (``C05``, ``H03``) in either set."""
    for root in (CORPUS, HELDOUT):
        if (root / name).is_dir():
            return root / name
    raise LookupError(name)


def expected(case: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((case / "expected.json").read_text())
    return doc


def facts(case: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((case / "facts.json").read_text())
    return doc


def log(case: Path) -> str:
    return (case / "launch.log").read_text()


def flags_of(facts: dict) -> dict:
    """The command's values by dest, as the diagnosis gets them (``services.bundles``: SGLang's
    flag table of the bundle's version, the default when unknown; none without a command)."""
    return bundle_flags(facts)


def run(case: Path, facts_doc: dict | None = None, log_text: str | None = None) -> Diagnosis:
    """The diagnosis of ``case``, or of its log and facts as a test changed them."""
    doc = facts(case) if facts_doc is None else facts_doc
    text = log(case) if log_text is None else log_text
    return diagnose(text, doc, flags_of(doc))


def states(summary: str, value: float | str | list) -> bool:
    """The summary names ``value`` (as printed, rounded the way a person would)."""
    if isinstance(value, list):
        return all(states(summary, v) for v in value)
    if isinstance(value, str):
        return value in summary
    shown = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", summary)]
    return any(abs(n - value) <= max(0.011, abs(value) * 0.001) for n in shown)


@dataclass(frozen=True)
class Score:
    """How a diagnosis did on one case: the category, the key numbers the summary does not
    state, whether the remedy holds one of the case's remedy keywords."""

    case: str
    want: str
    got: str
    missing: list[str] = field(default_factory=list)
    remedy_ok: bool = False

    @property
    def category_ok(self) -> bool:
        return self.want == self.got

    @property
    def right(self) -> bool:
        return self.category_ok and not self.missing and self.remedy_ok


def score(case: Path, found: Diagnosis) -> Score:
    want = expected(case)
    return Score(
        case=case.name,
        want=want["category"],
        got=found.category,
        missing=[k for k, v in want["key_numbers"].items() if not states(found.summary, v)],
        remedy_ok=any(k.lower() in found.remedy.lower() for k in want["remedy_keywords"]),
    )


def budget_with_change(facts_doc: dict, change: dict, tmp: Path) -> tuple[int, dict]:
    """``manage.py budget --json`` on a bundle's node (its ``facts.json``: node, model config,
    weights, version) for its command with ``change`` applied: ``(exit status, report)``;
    0 is ``ok`` or ``warn``, 1 blocked."""
    command = list(facts_doc["command"])
    for flag, value in change.items():
        command = _without(command, flag)
        if value is True:
            command.append(flag)
        elif value is not None:
            command += [flag, str(value)]
    node = facts_doc.get("node") or {}
    (tmp / "node.json").write_text(json.dumps({**node, "gpus": node.get("gpus") or []}))
    args = ["--node", str(tmp / "node.json"), "--json"]
    if facts_doc.get("model_config"):
        (tmp / "config.json").write_text(json.dumps(facts_doc["model_config"]))
        args += ["--model-config", str(tmp / "config.json")]
    if isinstance(facts_doc.get("model_weights_bytes"), int):
        args += ["--weights-bytes", str(facts_doc["model_weights_bytes"])]
    if facts_doc.get("engine_version"):
        args += ["--sglang-version", facts_doc["engine_version"]]
    out = io.StringIO()
    try:
        call_command("budget", *args, "--", *command, stdout=out)
        status = 0
    except SystemExit as exc:
        status = int(exc.code or 0)
    return status, json.loads(out.getvalue())


def _without(command: list[str], flag: str) -> list[str]:
    """``command`` without ``flag`` and its argument (``--flag value`` or ``--flag=value``)."""
    out, skip = [], False
    for word in command:
        if skip:
            skip = False
            if not word.startswith("--"):
                continue
        if word == flag:
            skip = True
            continue
        if word.startswith(flag + "="):
            continue
        out.append(word)
    return out
