"""The KV pool running out of room while a server runs: SGLang's token allocator refusing a
prefill or decode step ("Decode out of memory. Try to lower your batch size."), with the page
arithmetic when pages are larger than one token."""

from __future__ import annotations

import re

from nodes.domain.diagnosis.evidence import Bundle, Diagnosis, Rule

# sglang/srt/managers/schedule_batch.py (alloc_token_slots / alloc_paged_token_slots_*): the
# step asks for N tokens' slots and the pool has fewer, in whole pages when page_size > 1.
OUT_OF_TOKENS = re.compile(
    r"(?P<phase>Decode|Prefill) out of memory\. Try to lower your batch size"
)
TRY_ALLOCATE = re.compile(r"Try to allocate (?P<tokens>\d+) tokens")
AVAILABLE = re.compile(r"Ava(?:i)?l(?:i)?able tokens: (?P<tokens>\d+)")


def kv_pool_exhausted(bundle: Bundle) -> Diagnosis | None:
    """A prefill or decode step needed more KV slots than the pool had free: with a page size
    above 1 a decode step can need a new page per running request, so free tokens that look
    enough are too few pages."""
    hit = bundle.log.first(OUT_OF_TOKENS)
    if hit is None:
        return None
    asked, free = bundle.log.first(TRY_ALLOCATE), bundle.log.first(AVAILABLE)
    numbers: dict[str, float] = {}
    said = f"the KV pool ran out while serving ({hit[1]['phase'].lower()} step)"
    page = bundle.count("page_size")
    if asked is not None and free is not None:
        tokens, available = int(asked[1]["tokens"]), int(free[1]["tokens"])
        numbers.update(tokens_to_allocate=tokens, available_tokens=available)
        said += f": it asked for {tokens} tokens with {available} available"
        if page > 1:
            pages = available // page
            worst = tokens * page if hit[1]["phase"] == "Decode" else -(-tokens // page) * page
            numbers.update(page_size=page, free_pages=pages, worst_case_tokens_needed=worst)
            said += (
                f"; with --page-size {page} that is {pages} free pages, and a decode step of "
                f"{tokens} requests can need a new page each: up to {tokens} x {page} = "
                f"{worst} tokens"
            )
    return Diagnosis(
        category="gpu-oom-kv-cache",
        summary=said,
        remedy=(
            "cap the batch with --max-running-requests (lower batch size), give the KV pool "
            "more room (increase --mem-fraction-static)"
            + (", use --page-size 1 or upgrade SGLang (new-page counting fix)" if page > 1 else "")
        ),
        evidence=[bundle.evidence(h) for h in (hit, asked, free) if h is not None],
        numbers=numbers,
    )


#: The line that alone shows each rule's failure, whatever its figures say (engine._unreadable).
RECOGNISES: dict[Rule, tuple[str, re.Pattern[str]]] = {
    kv_pool_exhausted: (
        "gpu-oom-kv-cache",
        re.compile(r"(?:Decode|Prefill) out of memory\. Try to lower"),
    ),
}
