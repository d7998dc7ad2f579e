"""Free text read as a person reads it (FORMAT.md, 2026-12 clarifications): a snapshot note is
evidence of what it asserts, not of every word it mentions.

A note is split into sentences and clauses; a clause that is negated ("no OOMKilled flag was
collected", "not OOMKilled"), asked ("OOMKilled?"), hypothetical ("if the port had been taken,
… would say EADDRINUSE") or a to-do ("check for …") asserts nothing and is dropped; what is left
is read as before. The cues are plain English words, not the wording of one case.
"""

from __future__ import annotations

import re

# Sentences end at . ! ? ; or a line break; a clause ends at a comma or a dash before a new
# subject ("…, the log would say …"). A decimal point or a path keeps its sentence whole.
_SENTENCE = re.compile(r"(?<=[!?;])\s+|(?<=[a-z)'\"\]])\.\s+|\n+")
_CLAUSE = re.compile(
    r",\s+|\s+[-—–]\s+|\s*\(|\)\s*|\s+\b(?:but|and|although|though|while|whereas)\s+"
)
# A clause that is only an answer, after what it answers ("OOMKilled — no").
_ANSWER_NO = re.compile(r"(?i)^(?:no|false|none|0|n/a|not seen)\W*$")
_NEGATED = re.compile(
    r"(?i)!=|[:=]\s*(?:false|0(?![.\d]))|\b(?:no|not|never|none|nothing|nowhere|neither|nor|"
    r"without|cannot|absent|ruled out|free of|rather than|instead of|lacks?|lacking|"
    r"(?:is|was|were|are|did|does|do|has|have|had|could|would)n[’']t|can[’']t|won[’']t)\b"
)
_HYPOTHETICAL = re.compile(
    r"(?i)\b(?:if|whether|unless|in case|suppose|supposing|would|could|might|may|should|"
    r"check(?:list)? for|look(?:ing)? for|watch for|to check|checklist|e\.g\.|for example|"
    r"expect(?:ed)? to see)\b"
)


def asserted(text: str) -> str:
    """``text`` with the clauses that assert nothing dropped (joined by ``"; "``); ``""`` when
    none is left. A question (a sentence ending in ``?``) is dropped whole."""
    kept: list[str] = []
    for sentence in _SENTENCE.split(text.strip()):
        sentence = sentence.strip()
        if not sentence or sentence.endswith("?"):
            continue
        if _HYPOTHETICAL.search(sentence.split(",")[0]) and _HYPOTHETICAL.search(sentence):
            continue  # "If …, … would …": the whole sentence is a supposition
        clauses = [c.strip() for c in _CLAUSE.split(sentence) if c.strip()]
        says: list[str] = []
        for clause in clauses:
            if _ANSWER_NO.match(clause):
                says = says[:-1]  # "X — no": X is denied
            elif not _NEGATED.search(clause) and not _HYPOTHETICAL.search(clause):
                says.append(clause)
        # A sentence that asserts every clause is kept as written (patterns span clauses).
        kept += [sentence] if says == clauses else says
    return "; ".join(kept)
