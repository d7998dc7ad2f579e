"""Rules for after the server was ready: it served, then stopped."""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodes.domain.diagnosis.evidence import (
    VLLM_DEFAULT_UTILIZATION,
    Bundle,
    Diagnosis,
    Evidence,
    Hit,
    _fmt,
)
from nodes.domain.diagnosis.host_memory import NODE_OOM_KILL
from nodes.domain.diagnosis.pytorch_oom import gib_of

# SGLang's ready line (§5) and vLLM's (uvicorn's) end of start-up.
SERVED = re.compile(r"The server is fired up and ready to roll!|Application startup complete\.")


NCCL_WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), "
    r"OpType=(?P<op>\w+).*?Timeout\(ms\)=(?P<timeout>\d+)\) ran for (?P<ran>\d+) milliseconds"
)


RANK_GONE = re.compile(
    r"Rank (?P<rank>\d+) scheduler (?:is dead|died)|(?P<title>sglang::scheduler\S*) \(PID "
    r"(?P<pid>\d+)\) died while serving"
)


# What the panel itself saw (its notes in the failure snapshot, ``panel: …``).
HEALTH_FAILED = re.compile(r"health check failed (?P<times>\d+) times in a row: (?P<why>.+)")


@dataclass(frozen=True)
class Watchdog:
    """NCCL's watchdog line: the collective ran ``ran_s`` seconds past ``timeout_s``."""

    hit: Hit
    ran_s: float
    timeout_s: float


@dataclass(frozen=True)
class StoppedServing:
    """After the ready line (``ready``): the first NCCL watchdog timeout, the first TP rank the
    log says died, a scheduler process a snapshot note says died (``died``), the panel's note
    of failed health checks, and the kernel's OOM kills in the snapshots."""

    ready: Hit
    tp: int
    watchdog: Watchdog | None
    gone: Hit | None
    died: re.Match[str] | None
    health: re.Match[str] | None
    kills: tuple[Evidence, ...]


def _stopped_serving(bundle: Bundle) -> StoppedServing | None:
    ready = bundle.log.first(SERVED)
    if ready is None:
        return None
    after = [(n, m) for n, m in bundle.log.find(NCCL_WATCHDOG) if n > ready[0]]
    gone = [(n, m) for n, m in bundle.log.find(RANK_GONE) if n > ready[0]]
    notes = bundle.notes()
    died = next((m for m in map(RANK_GONE.search, notes) if m and m["title"]), None)
    health = next((m for m in map(HEALTH_FAILED.search, notes) if m), None)
    if not (after or gone or died or health):
        return None
    watchdog = None
    if after:
        hit = after[0]
        watchdog = Watchdog(hit, int(hit[1]["ran"]) / 1000, int(hit[1]["timeout"]) / 1000)
    first_gone = gone[0] if gone else None
    return StoppedServing(
        ready, bundle.tp(), watchdog, first_gone, died, health, tuple(_oom_kills(bundle))
    )


def served_then_failed(bundle: Bundle) -> Diagnosis | None:
    """The server reached ready, then stopped serving: a NCCL collective timed out (the
    watchdog aborts every rank), a TP rank died (SGLang ≤ 0.5.9 has no liveness watchdog, so
    the HTTP server keeps answering while ``/health`` says 503, §4–5), or ``/health`` kept
    failing. Memory causes (host pools pinned, a cgroup limit) are earlier rules."""
    found = _stopped_serving(bundle)
    if found is None:
        return None
    if found.watchdog is not None:
        return _watchdog_diagnosis(bundle, found.ready, found.tp, found.watchdog)
    return _stopped_diagnosis(bundle, found)


def _watchdog_diagnosis(bundle: Bundle, ready: Hit, tp: int, watchdog: Watchdog) -> Diagnosis:
    match = watchdog.hit[1]
    return Diagnosis(
        category="health-check-failure",
        summary=(
            f"the server was ready (line {ready[0]}), then a NCCL {match['op']} collective "
            f"(SeqNum {match['seq']}) ran {watchdog.ran_s:.0f} s past its "
            f"{watchdog.timeout_s:.0f} s timeout and the watchdog aborted the ranks: one rank "
            "stalled or the GPU interconnect failed"
        ),
        remedy=(
            "restart the launch; look for the stalled rank or a failing link (dmesg for Xid "
            "errors, nvidia-smi -q for ECC/NVLink errors, NCCL_DEBUG=INFO), and raise "
            "--dist-timeout only if a rank is legitimately slow"
        ),
        evidence=[bundle.evidence(ready), bundle.evidence(watchdog.hit)],
        numbers={
            "tp_size": tp,
            "ready_line": ready[0],
            "nccl_timeout_s": watchdog.timeout_s,
            "nccl_ran_s": round(watchdog.ran_s, 1),
        },
    )


def _stopped_diagnosis(bundle: Bundle, found: StoppedServing) -> Diagnosis:
    numbers: dict[str, float] = {"tp_size": found.tp, "ready_line": found.ready[0]}
    evidence = [bundle.evidence(found.ready)]
    if found.died is not None:
        numbers["dead_pid"] = int(found.died["pid"])
        evidence.append(Evidence(found.died.group(0), None, "snapshot"))
    elif found.gone is not None:
        evidence.append(bundle.evidence(found.gone))
    evidence += found.kills[:2]
    if found.health is not None:
        numbers["health_failures"] = int(found.health["times"])
        evidence.append(Evidence(found.health.group(0), None, "snapshot"))
    summary = f"the server was ready (line {found.ready[0]}), then stopped serving: "
    summary += _stopped_what(found)
    if found.died is not None or found.gone is not None:
        summary += "; the HTTP server may still answer while the dead rank's work never ends"
    return Diagnosis(
        category="health-check-failure",
        summary=summary,
        remedy=(
            "restart the launch (stop it first so every rank's memory comes back); if the "
            "kernel OOM-killed the rank, give the node more free host RAM or a smaller host pool "
            "(--hicache-size); otherwise find who killed it (dmesg, an operator, the scheduler of "
            "the cluster) and, for a stuck scheduler, take a py-spy dump before stopping"
        ),
        evidence=evidence,
        numbers=numbers,
    )


def _stopped_what(found: StoppedServing) -> str:
    """What stopped the server: the dead process or rank, the OOM killer, the health checks."""
    what = ""
    if found.died is not None:
        what = f"{found.died['title']} (PID {found.died['pid']}) died while serving"
    elif found.gone is not None:
        what = f"TP rank {found.gone[1]['rank']} died while serving"
    if found.kills:
        what = (what or "a rank was killed") + " — the kernel's OOM killer (host RAM)"
    if found.health is not None:
        answered = f"/health failed {found.health['times']} times in a row ({found.health['why']})"
        what = f"{what}; {answered}" if what else answered
    return what


def _oom_kills(bundle: Bundle) -> list[Evidence]:
    return [
        Evidence(line[:300], None, "snapshot")
        for line in bundle.kernel_lines()
        if NODE_OOM_KILL.search(line)
    ]


RUNTIME_OOM = re.compile(
    r"OutOfMemoryError: (?:CUDA|HIP) out of memory\. Tried to allocate (?P<tried>[\d.]+) "
    r"(?P<unit>[KGM]iB|bytes)"
)
# The same text's total and this process's use (PyTorch ≥ 2.1), when it prints them.
CAPACITY = re.compile(r"has a total capaci?ty of (?P<total>[\d.]+ (?:[KGMT]iB|bytes))")
IN_USE = re.compile(r"this process has (?P<used>[\d.]+ (?:[KGMT]iB|bytes)) memory in use")


def served_then_gpu_oom(bundle: Bundle) -> Diagnosis | None:
    """Out of GPU memory after the server was ready (under load): mem-fraction-static (vLLM:
    --gpu-memory-utilization) left too little outside the static pool for activations
    (FORMAT.md: ``mem-fraction-too-high`` is for an OOM after ready)."""
    ready = bundle.log.first(SERVED)
    if ready is None:
        return None
    hits = [(n, m) for n, m in bundle.log.find(RUNTIME_OOM) if n > ready[0]]
    if not hits:
        return None
    hit = hits[0]
    tried = f"{hit[1]['tried']} {hit[1]['unit']}"
    numbers: dict[str, float] = {"tried_to_allocate": float(hit[1]["tried"])}
    line = hit[1].string
    total = CAPACITY.search(line)
    used = IN_USE.search(line)
    if bundle.vllm:
        return _vllm_served_oom(bundle, ready, hit, tried, numbers, total, used)
    mfs = bundle.number("mem_fraction_static")
    lower = ""
    if mfs is not None:
        numbers["mem_fraction_static"] = mfs
        numbers["suggested_mem_fraction_static"] = round(max(mfs - 0.05, 0.3), 2)
        lower = f" (--mem-fraction-static {numbers['suggested_mem_fraction_static']:g})"
    return Diagnosis(
        category="mem-fraction-too-high",
        summary=(
            f"the server was ready (line {ready[0]}), then ran out of GPU memory serving (tried "
            f"to allocate {tried})"
            + (f" with --mem-fraction-static {mfs:g}" if mfs is not None else "")
            + ": the static pool leaves too little for activations under this load"
        ),
        remedy=(
            f"lower --mem-fraction-static{lower}, or cap the load with --max-running-requests "
            "or --chunked-prefill-size"
        ),
        evidence=[bundle.evidence(ready), bundle.evidence(hit)],
        numbers=numbers,
    )


def _vllm_served_oom(
    bundle: Bundle,
    ready: Hit,
    hit: Hit,
    tried: str,
    numbers: dict[str, float],
    total: re.Match[str] | None,
    used: re.Match[str] | None,
) -> Diagnosis:
    """vLLM's budget is --gpu-memory-utilization x the card; what a request's activations
    (a long prompt, a large image) need beyond it is what ran out."""
    util = bundle.engine_number("gpu_memory_utilization") or VLLM_DEFAULT_UTILIZATION
    numbers["gpu_memory_utilization"] = util
    tp = bundle.tp()
    numbers["tensor_parallel_size"] = tp
    said = [f"the server was ready (line {ready[0]}), then ran out of GPU memory serving (TP {tp}"]
    longest = bundle.engine_number("max_model_len")
    if longest is not None:
        numbers["max_model_len"] = int(longest)
        said[0] += f", --max-model-len {int(longest)}"
    said[0] += ")"
    said.append(f"tried to allocate {tried}")
    if total is not None:
        card = gib_of(total["total"])
        budget = round(util * card, 2)
        numbers.update(gpu_total_gib=round(card, 2), vllm_budget_gib=budget)
        said.append(
            f"--gpu-memory-utilization {_fmt(util)} gives vLLM {_fmt(util)} x {card:.2f} = "
            f"{budget:.2f} GiB of the {total['total']} card, {card - budget:.2f} GiB outside it"
        )
    if used is not None:
        numbers["process_in_use_gib"] = round(gib_of(used["used"]), 2)
        said.append(f"this process had {used['used']} in use")
    lower = round(max(util - 0.05, 0.5), 2)
    numbers["suggested_gpu_memory_utilization"] = lower
    return Diagnosis(
        category="mem-fraction-too-high",
        summary="; ".join(said) + ": a request needed more activation memory than was left",
        remedy=(
            f"lower --gpu-memory-utilization (to {lower:.2f}), enable chunked prefill and cap "
            "--max-num-batched-tokens, lower --max-model-len, or cap multimodal inputs "
            "(--limit-mm-per-prompt, max_pixels)"
        ),
        evidence=[bundle.evidence(ready), bundle.evidence(hit)],
        numbers=numbers,
    )


def served_then_killed(bundle: Bundle) -> Diagnosis | None:
    """Ready, then the server ended by a signal (``exit`` in the facts) with no other evidence:
    killed from outside (an operator, a scheduler, the OOM killer without a line in dmesg). Why
    is not shown, so the category stays ``unknown``; the summary says what is known."""
    ready = bundle.log.first(SERVED)
    code = (bundle.facts.get("exit") or {}).get("code")
    if ready is None or not isinstance(code, int) or code >= 0:
        return None
    name = (bundle.facts.get("exit") or {}).get("signal") or f"signal {-code}"
    held = [
        g
        for s in bundle.snapshots()
        for g in s.get("gpus") or []
        if (g.get("memory_used_bytes") or 0) > 2**30
        and not any(p.get("gpu_index") == g.get("index") for p in s.get("gpu_processes") or [])
    ]
    kills = _oom_kills(bundle)
    summary = f"the server was ready (line {ready[0]}), then was killed by {name} while serving"
    secondary = []
    if kills:
        summary += "; the kernel's OOM killer struck (host RAM)"
    if held:
        secondary.append("leaked-gpu-memory")
        summary += (
            f"; memory stays on GPU {', '.join(str(g.get('index')) for g in held)} with no process"
        )
    return Diagnosis(
        category="unknown",
        secondary_categories=secondary,
        summary=summary,
        remedy=(
            "find who sent the signal (dmesg for the OOM killer, the cluster scheduler, an "
            "operator); clean up the GPUs (memory held with no process needs a reset or a "
            "reboot), then relaunch"
        ),
        evidence=[bundle.evidence(ready), *kills[:2]],
        numbers={"exit_code": code, "gpus_held_with_no_process": len(held)},
    )
