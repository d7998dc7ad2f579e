"""Rules for after the server was ready: it served, then stopped."""

from __future__ import annotations

import re

from nodes.domain.diagnosis.evidence import Bundle, Diagnosis, Evidence
from nodes.domain.diagnosis.host_memory import NODE_OOM_KILL

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


def served_then_failed(bundle: Bundle) -> Diagnosis | None:
    """The server reached ready, then stopped serving: a NCCL collective timed out (the
    watchdog aborts every rank), a TP rank died (SGLang ≤ 0.5.9 has no liveness watchdog, so
    the HTTP server keeps answering while ``/health`` says 503, §4–5), or ``/health`` kept
    failing. Memory causes (host pools pinned, a cgroup limit) are earlier rules."""
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
    evidence = [bundle.evidence(ready)]
    numbers: dict[str, float] = {"tp_size": bundle.tp(), "ready_line": ready[0]}
    if after:
        hit = after[0]
        ran_s, timeout_s = int(hit[1]["ran"]) / 1000, int(hit[1]["timeout"]) / 1000
        numbers.update(nccl_timeout_s=timeout_s, nccl_ran_s=round(ran_s, 1))
        evidence.append(bundle.evidence(hit))
        summary = (
            f"the server was ready (line {ready[0]}), then a NCCL {hit[1]['op']} collective "
            f"(SeqNum {hit[1]['seq']}) ran {ran_s:.0f} s past its {timeout_s:.0f} s timeout "
            "and the watchdog aborted the ranks: one rank stalled or the GPU interconnect failed"
        )
        remedy = (
            "restart the launch; look for the stalled rank or a failing link (dmesg for Xid "
            "errors, nvidia-smi -q for ECC/NVLink errors, NCCL_DEBUG=INFO), and raise "
            "--dist-timeout only if a rank is legitimately slow"
        )
    else:
        what, kills = "", _oom_kills(bundle)
        if died is not None:
            what = f"{died['title']} (PID {died['pid']}) died while serving"
            numbers["dead_pid"] = int(died["pid"])
            evidence.append(Evidence(died.group(0), None, "snapshot"))
        elif gone:
            what = f"TP rank {gone[0][1]['rank']} died while serving"
            evidence.append(bundle.evidence(gone[0]))
        if kills:
            what = (what or "a rank was killed") + " — the kernel's OOM killer (host RAM)"
            evidence += kills[:2]
        if health is not None:
            numbers["health_failures"] = int(health["times"])
            evidence.append(Evidence(health.group(0), None, "snapshot"))
            answered = f"/health failed {health['times']} times in a row ({health['why']})"
            what = f"{what}; {answered}" if what else answered
        summary = f"the server was ready (line {ready[0]}), then stopped serving: {what}"
        if died is not None or gone:
            summary += "; the HTTP server may still answer while the dead rank's work never ends"
        remedy = (
            "restart the launch (stop it first so every rank's memory comes back); if the "
            "kernel OOM-killed the rank, give the node more free host RAM or a smaller host pool "
            "(--hicache-size); otherwise find who killed it (dmesg, an operator, the scheduler of "
            "the cluster) and, for a stuck scheduler, take a py-spy dump before stopping"
        )
    return Diagnosis(
        category="health-check-failure",
        summary=summary,
        remedy=remedy,
        evidence=evidence,
        numbers=numbers,
    )


def _oom_kills(bundle: Bundle) -> list[Evidence]:
    return [
        Evidence(str(line)[:300], None, "snapshot")
        for s in bundle.snapshots()
        for line in s.get("kernel_log") or []
        if NODE_OOM_KILL.search(str(line))
    ]
