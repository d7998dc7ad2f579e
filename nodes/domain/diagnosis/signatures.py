"""Failures named by one line of the log, as data: a pattern, the category, and the summary and
remedy written with the pattern's named groups. Adding such a signature is one entry in
``SIGNATURES``; failures that need arithmetic or snapshots are rules of their own modules."""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodes.domain.diagnosis.evidence import Bundle, Diagnosis


@dataclass(frozen=True)
class Signature:
    """``summary`` and ``remedy`` are ``str.format`` templates over the match's named groups;
    ``numbers`` names the groups that are figures (kept as data)."""

    category: str
    pattern: re.Pattern[str]
    summary: str
    remedy: str
    numbers: tuple[str, ...] = ()

    def __call__(self, bundle: Bundle) -> Diagnosis | None:
        hit = bundle.log.first(self.pattern)
        if hit is None:
            return None
        groups = {k: v or "" for k, v in hit[1].groupdict().items()}
        return Diagnosis(
            category=self.category,
            summary=self.summary.format(**groups) + _context(bundle),
            remedy=self.remedy.format(**groups),
            evidence=[bundle.evidence(hit)],
            numbers={k: float(groups[k]) for k in self.numbers if _figure(groups.get(k, ""))},
        )

    @property
    def __name__(self) -> str:  # rules are named in logs and tests by their function name
        return f"signature:{self.category}"


def _context(bundle: Bundle) -> str:
    """What else the bundle says of the launch: its TP size and how it ended."""
    said = [f"TP {bundle.tp()}"]
    code = (bundle.facts.get("exit") or {}).get("code")
    if isinstance(code, int):
        said.append(f"exit code {code}")
    return f" ({', '.join(said)})"


def _figure(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


SIGNATURES: tuple[Signature, ...] = (
    # transformers refuses a model that ships its own code (§6).
    Signature(
        "trust-remote-code",
        re.compile(
            r"requires you to execute the configuration file in that repo|"
            r"contains custom code which must be executed"
        ),
        summary=(
            "the model ships its own config/model code (transformers refuses to run it) and "
            "the launch did not pass --trust-remote-code"
        ),
        remedy=(
            "review the repo's code, then add --trust-remote-code (and pin the model revision "
            "you reviewed)"
        ),
    ),
)
