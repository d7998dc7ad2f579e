"""How the diagnosis does on the case bundles: per case, the category it names against the
expected one, the key numbers its summary misses, whether its remedy holds a remedy keyword;
then the scores, for the corpus (tests/fixtures/cases, which the engine was built on) and the
held-out set (tests/fixtures/heldout, written from public threads the engine had not seen).

A case is *right* when category, every key number and a remedy keyword are right; the category
score counts the category alone. Two harder readings of every case are scored too: with the
node's RAM, GPUs and engine version unknown (``nulls``: only the category counts), and with a
note added that mentions failure words without asserting them (``mentions``).

Run from the project folder: ``.venv/bin/python -m benchmarks.diagnosis_cases [--markdown]``.
"""

from __future__ import annotations

import argparse
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
django.setup()

from tests.cases import CORPUS, HELDOUT, case_dirs, facts, run, score  # noqa: E402

MENTION = (
    "No OOMKilled flag was collected; dmesg shows no 'Out of memory: Killed process' line and "
    "nothing says EADDRINUSE."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print tables for RESULTS.md")
    options = parser.parse_args()
    for title, root in (("corpus", CORPUS), ("held-out", HELDOUT)):
        cases = case_dirs(root)
        rows, right, category, nulls, mentions = [], 0, 0, 0, 0
        for case in cases:
            result = score(case, run(case))
            doc = facts(case)
            doc["node"] = {**(doc.get("node") or {}), "host_ram_bytes": None, "gpus": None}
            doc["engine_version"] = None
            nulls += run(case, facts_doc=doc).category == result.want
            doc = facts(case)
            snapshots = doc.get("snapshots") or [{"phase": "after_failure"}]
            snapshots[-1]["notes"] = [*(snapshots[-1].get("notes") or []), MENTION]
            doc["snapshots"] = snapshots
            mentions += run(case, facts_doc=doc).category == result.got
            right += result.right
            category += result.category_ok
            rows.append(result)
        n = len(cases) or 1
        print(
            f"{'### ' if options.markdown else ''}{title}: {right}/{len(cases)} right "
            f"({100 * right / n:.0f}%), category {category}/{len(cases)}, "
            f"category with facts unknown {nulls}/{len(cases)}, "
            f"unchanged by a mention {mentions}/{len(cases)}"
        )
        if options.markdown:
            print("\n| case | expected | named | numbers missed | remedy |\n|---|---|---|---|---|")
        for r in rows:
            mark = "" if r.category_ok else " ✗"
            missed = ", ".join(r.missing) or "—"
            remedy = "ok" if r.remedy_ok else "missed"
            if options.markdown:
                print(f"| {r.case} | {r.want} | {r.got}{mark} | {missed} | {remedy} |")
            else:
                print(f"  {r.case:5} {r.want:32} {r.got + mark:34} {missed:30} {remedy}")
        print()


if __name__ == "__main__":
    main()
