"""The ``rankwise-profiles/1`` document's models: what they accept, and each refusal in words."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodes.domain.exchange_document import (
    FORMAT,
    DocumentRefused,
    ProfileEntry,
    ProfilesDocument,
    RevisionEntry,
    StampEntry,
    read_document,
)

STAMP = {"node": "gpu-01", "gpu_name": "NVIDIA H200", "gpu_count": 8, "gpu_memory_bytes": 2**37}


def doc_with(profile: dict | None = None, **revision) -> dict:
    revision = {"number": 1, "args": ["--model-path", "/m"], **revision}
    profile = {"name": "kimi", "revisions": [revision], **(profile or {})}
    return {"format": FORMAT, "exported_at": "2026-01-01T00:00:00Z", "profiles": [profile]}


def test_an_export_reads_back_with_its_fields():
    doc = doc_with(
        {"created_by": "pat", "team": "infra", "visibility": "team", "unknown": 1},
        env={"HF_TOKEN": "****"},
        message="m",
        author="pat",
        created="2026-01-01T00:00:00+00:00",
        node="gpu-01",
        sglang_version="0.5.9",
        verdict="warn",
        report={"lines": []},
        stamps=[{**STAMP, "healthy_seconds": 900, "observed": {}, "estimate": None}],
    )
    read = read_document(doc)
    profile = read.profiles[0]
    assert (profile.name, profile.team, profile.visibility) == ("kimi", "infra", "team")
    revision = profile.revisions[0]
    assert revision.env == {"HF_TOKEN": "****"} and revision.verdict == "warn"
    assert revision.stamps and revision.stamps[0].gpu_count == 8
    assert read_document(doc_with()).profiles[0].revisions[0].env == {}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "not a rankwise-profiles/1 document"),
        ({"format": "rankwise-profiles/2", "profiles": []}, "not a rankwise-profiles/1 document"),
        ({"format": FORMAT}, "profiles must be a list of at most 500"),
        (
            {"format": FORMAT, "profiles": [{"name": "x", "revisions": []}] * 501},
            "profiles must be a list of at most 500",
        ),
        ({"format": FORMAT, "profiles": [{"revisions": []}]}, "each profile needs a name"),
        ({"format": FORMAT, "profiles": ["kimi"]}, "each profile needs a name"),
        ({"format": FORMAT, "profiles": [{"name": "Kimi!", "revisions": []}]}, "'Kimi!': Use 1–63"),
        ({"format": FORMAT, "profiles": [{"name": "kimi"}]}, "kimi: revisions must be a list"),
        (doc_with({"visibility": "all"}), "kimi: visibility is everyone or team"),
        (doc_with({"created_by": 7}), "kimi: created_by must be text of at most 150 characters"),
        (doc_with({"team": "t" * 64}), "kimi: team must be text of at most 63 characters"),
        (doc_with({"revisions": [7]}), "kimi: each revision needs a number of 1 or more"),
        (doc_with({"revisions": [{"args": []}]}), "kimi: each revision needs a number of 1 or"),
        (doc_with(number=0), "kimi: number must be a whole number from 1 to 1000000"),
        (doc_with(number=True), "kimi: number must be a whole number from 1 to 1000000"),
        (doc_with(number="1"), "kimi: number must be a whole number from 1 to 1000000"),
        (doc_with(args="--tp 2"), "kimi@1: args must be a list of strings"),
        (doc_with(args=["--tp", 2]), "kimi@1: args must be a list of strings"),
        (doc_with(args=["-x"] * 2001), "kimi@1: args are longer than a command line can be"),
        (doc_with(args=["x" * 65537]), "kimi@1: args are longer than a command line can be"),
        (doc_with(env={"A": 1}), "kimi@1: env must map variable names to strings"),
        (doc_with(env={"A B": "1"}), "kimi@1: env: 'A B' is not an environment variable name"),
        (doc_with(message="m" * 501), "kimi@1: message must be text of at most 500 characters"),
        (doc_with(verdict="fine"), "kimi@1: verdict is ok, warn or block"),
        (doc_with(message="a\x00b"), "kimi@1: message holds a NUL character"),
        (doc_with(report={"k": [{"\x00": 1}]}), "kimi@1: report holds a NUL character"),
        (doc_with({"created_by": "\x00"}), "kimi: created_by holds a NUL character"),
        (doc_with(report=[]), "kimi@1: report must be an object"),
        (doc_with(sglang_version="latest"), "kimi@1: 'latest' is not an SGLang version"),
        (doc_with(sglang_version=5), "kimi@1: '5' is not an SGLang version"),
        (doc_with(stamps=5), "kimi@1: stamps must be a list of at most 100"),
        (doc_with(stamps=[STAMP] * 101), "kimi@1: stamps must be a list of at most 100"),
        (doc_with(stamps=["gpu-01"]), "kimi@1: a stamp needs node, gpu_name, gpu_count"),
        (doc_with(stamps=[{"node": "gpu-01"}]), "kimi@1: a stamp needs gpu_name"),
        (
            doc_with(stamps=[{**STAMP, "gpu_count": 65}]),
            "kimi@1: a stamp's gpu_count must be a whole number from 1 to 64",
        ),
        (
            doc_with(stamps=[{**STAMP, "healthy_seconds": "abc"}]),
            "kimi@1: a stamp's healthy_seconds must be a whole number from 0 to 2147483647",
        ),
        (doc_with(stamps=[{**STAMP, "observed": []}]), "kimi@1: a stamp's observed must be an"),
        (
            doc_with(stamps=[{**STAMP, "estimate": {"x": "\x00"}}]),
            "kimi@1: a stamp's estimate holds a NUL character",
        ),
        (
            doc_with(stamps=[{**STAMP, "gpu_name": "g" * 129}]),
            "kimi@1: a stamp's gpu_name must be text of at most 128 characters",
        ),
    ],
)
def test_a_document_that_cannot_be_read_is_refused_saying_where_and_what(doc, message):
    with pytest.raises(DocumentRefused) as refused:
        read_document(doc)
    assert str(refused.value).startswith(message), str(refused.value)


def test_revisions_are_counted_across_the_document():
    revisions = [{"number": n, "args": []} for n in range(1, 1001)]
    profiles = [{"name": f"p{i}", "revisions": revisions} for i in range(3)]
    with pytest.raises(DocumentRefused, match="^at most 2000 revisions per document$"):
        read_document({"format": FORMAT, "profiles": profiles})


def test_the_first_problem_in_document_order_is_the_one_named():
    doc = doc_with(args=[1], verdict="fine")
    doc["profiles"].append({"name": "BAD", "revisions": []})
    with pytest.raises(DocumentRefused, match="^kimi@1: args must be a list of strings$"):
        read_document(doc)


def test_the_guide_names_every_field_of_the_format():
    guide = (Path(__file__).resolve().parents[2] / "docs" / "profiles.md").read_text()
    section = guide[guide.index("format `rankwise-profiles/1`") :][:3000]
    named = set(re.findall(r'"(\w+)"', section))
    for model in (ProfilesDocument, ProfileEntry, RevisionEntry, StampEntry):
        missing = set(model.model_fields) - named
        assert not missing, f"docs/profiles.md's format block lacks {model.__name__} {missing}"


@pytest.mark.parametrize(
    ("revision", "message"),
    [
        ({"args": ["--model-path", "/m\udfff"]}, "kimi@1: args holds a lone UTF-16 surrogate"),
        (
            {"stamps": [{**STAMP, "observed": {"gpu_used_bytes": {"0": 10**100}}}]},
            "a stamp's observed holds a number beyond",
        ),
        ({"report": {"lines": 5}}, "kimi@1: report's lines must be a list of strings"),
        ({"report": {"messages": [{"text": 5}]}}, "report's messages must be objects"),
        ({"report": {"x": float("nan")}}, "kimi@1: report holds NaN or Infinity"),
        ({"created": "0001-01-01T00:00:00+01:00"}, "is not an ISO 8601 time a database holds"),
        (
            {"stamps": [{**STAMP, "stamped_at": "9999-12-31T23:59:59-01:00"}]},
            "is not an ISO 8601 time a database holds",
        ),
        ({"created": "yesterday"}, "'yesterday' is not an ISO 8601 time"),
    ],
)
def test_what_a_database_cannot_store_or_a_page_cannot_print_is_refused(revision, message):
    """Found by trying: each of these was imported, then made the profile's page (and every
    export holding it) answer 500, or failed at insert."""
    with pytest.raises(DocumentRefused, match=re.escape(message)):
        read_document(doc_with(**revision))
