"""Rules for host memory running out: SGLang's own precheck, the pinned HiCache pools beyond the
node's RAM (at start-up or later), a container's cgroup limit."""

from __future__ import annotations

import math
import re

from nodes.domain.diagnosis.evidence import Bundle, Diagnosis, Evidence, GiB, _fmt, _num
from nodes.domain.diagnosis.host_pools import (
    HOST_RESERVE_GB,
    _available_before,
    _host_pool_source,
    _host_pools,
    _host_share,
)

PRECHECK = re.compile(
    r"Not enough host memory available\. Requesting (?P<requested>[\d.]+) GB but only have "
    r"(?P<free>[\d.]+) GB free"
)


def host_precheck(bundle: Bundle) -> Diagnosis | None:
    """SGLang's own host-memory check refused the HiCache pool (§2, §6)."""
    hit = bundle.log.first(PRECHECK)
    if hit is None:
        return None
    requested, free = _num(hit[1]["requested"]), _num(hit[1]["free"])
    usable = free - HOST_RESERVE_GB
    short = requested - usable
    reserve = round(HOST_RESERVE_GB, 2)
    return Diagnosis(
        category="host-mem-precheck",
        secondary_categories=["host-oom-hicache"],
        summary=(
            f"host RAM precheck failed: hicache {_fmt(requested)} GB requested, {_fmt(free)} GB "
            f"free minus SGLang's fixed 10 GiB ({_fmt(reserve)} GB) reserve = {_fmt(usable)} GB "
            f"usable (short by {_fmt(short)} GB)"
        ),
        remedy=(
            f"reduce --hicache-size so that --hicache-size <= MemAvailable - {_fmt(reserve)} GB "
            f"({math.floor(usable)} GB per rank here; the 10 GiB reserve is SGLang's own), or "
            "free host memory before launching"
        ),
        evidence=[bundle.evidence(hit)],
        numbers={
            "requested_gb": requested,
            "reported_free_gb": free,
            "reserve_gb": reserve,
            "effective_free_gb": round(usable, 2),
            "shortfall_gb": round(short, 2),
            # Every rank on the node pins its own pool out of the same free memory.
            "suggested_hicache_size_gb": max(math.floor(usable / bundle.local_ranks()), 0),
        },
    )


def host_oom_hicache(bundle: Bundle) -> Diagnosis | None:
    """The host pools SGLang says it pins, summed over the ranks on this node, exceed the
    node's memory: each rank checked alone (≤ 0.5.18), so none refused (§2, §6)."""
    found = _host_pools(bundle)
    if found is None:
        return None
    ranks, pools, each, total = found.ranks, found.pools, found.each, found.total
    hits = found.hits
    ram, before = bundle.host_ram_gb(), _available_before(bundle)
    limit = before if before is not None else ram
    if limit is None or total <= limit:
        return None
    tp = bundle.count("tp_size", "tensor_parallel_size", default=ranks)
    numbers = {
        "tp_size": tp,
        "local_ranks": ranks,
        "hicache_size_gb_per_rank": pools[0],
        "per_rank_total_gb": each,
        "aggregate_gb": total,
    }
    if len(pools) > 1:
        parts = " + ".join(f"{_fmt(p)} GB" for p in pools)
        per = f"host pools {parts} = {_fmt(each)} GB per rank"
        numbers["dsa_indexer_gb_per_rank"] = pools[1]
    else:
        per = f"--hicache-size {_fmt(each)} GB is per TP rank; {ranks} ranks"
    against = f"{_fmt(limit)} GB {'available' if before is not None else 'host RAM'}"
    if ram is not None:
        numbers["host_ram_gb"] = round(ram, 2)
        if before is not None:
            numbers["mem_available_before_gb"] = round(before, 2)
            against += f" ({_fmt(ram)} GB host RAM)"
    if len(pools) > 1:
        summary = (
            f"host RAM exhausted: {per} x {ranks} local ranks = {_fmt(total)} GB > {against}; "
            "SGLang checked each rank alone"
        )
    else:
        summary = f"host RAM exhausted: {per} x {_fmt(each)} GB = {_fmt(total)} GB > {against}"
    meant = math.floor(pools[0] / ranks)
    fits = math.floor((limit - HOST_RESERVE_GB) / ranks - (each - pools[0]))
    if fits > 0:
        numbers["suggested_hicache_size_gb"] = fits
    evidence = [bundle.evidence(hit) for hit in hits[: ranks * len(pools)]]
    for snapshot in bundle.facts.get("snapshots") or []:
        for line in (snapshot.get("kernel_log") or [])[:3]:
            evidence.append(Evidence(str(line)[:300], None, "snapshot"))
    return Diagnosis(
        category="host-oom-hicache",
        summary=summary,
        remedy=(
            f"--hicache-size is per rank (the aggregate across local ranks is what the node "
            f"must hold): reduce --hicache-size to at most {max(fits, 0)} GB per rank here; if "
            f"{_fmt(pools[0])} GB was meant for the whole node, that is --hicache-size {meant}"
        ),
        evidence=evidence,
        numbers=numbers,
    )


NODE_OOM_KILL = re.compile(r"Out of memory: Killed process (?P<pid>\d+)")


SHELL_KILLED = re.compile(r"^\S+: line \d+:\s+(?P<pid>\d+) Killed\s")


def host_oom_pinned(bundle: Bundle) -> Diagnosis | None:
    """The host pools fit at start-up, but pinned (``cudaHostRegister``/``pin_memory``, §2) they
    cannot be reclaimed, and the kernel's OOM killer struck later: the pools' share of this
    server's host budget is what to show. Needs the kernel's ``Out of memory: Killed process``."""
    pools = _host_pools(bundle)
    kills = [
        Evidence(str(line)[:300], None, "snapshot")
        for s in bundle.snapshots()
        for line in s.get("kernel_log") or []
        if NODE_OOM_KILL.search(str(line))
    ]
    if pools is None or not kills:
        return None
    source, numbers = _host_pool_source(bundle)
    tp = bundle.tp()
    numbers.update(
        tp_size=tp,
        hicache_gb_per_rank=pools.each,
        local_ranks=pools.ranks,
        hicache_gb_total=pools.total,
    )
    share = _host_share(bundle) or (
        (before, "the memory available before the launch")
        if (before := _available_before(bundle)) is not None
        else None
    )
    against, fits = "", ""
    if share is not None:
        budget, what = share
        numbers.update(host_budget_gb=round(budget, 2))
        numbers["fraction_of_budget_pinned"] = round(pools.total / budget, 2)
        against = f", {pools.total / budget:.2f} of {what} ({_fmt(budget)} GB)"
        # Pinned memory is never reclaimed: keep the pools under half of the share (§9 rule 1).
        numbers["suggested_hicache_size_gb"] = math.floor(0.5 * budget / pools.ranks)
        fits = f"; --hicache-size {math.floor(0.5 * budget / pools.ranks)} or less per rank keeps "
        fits += "the pinned total under half of the host budget share"
    evidence = [bundle.evidence(hit) for hit in pools.hits[: pools.ranks]]
    killed = bundle.log.first(SHELL_KILLED)
    if killed is not None:
        evidence.append(bundle.evidence(killed))
    return Diagnosis(
        category="host-oom-hicache",
        summary=(
            f"host RAM exhausted after start-up: {source} = {pools.each:.2f} GB pinned per rank x "
            f"{pools.ranks} ranks (TP {tp}) = {pools.total:.2f} GB{against}; pinned pages cannot "
            "be reclaimed, so later load drove the node into the kernel OOM killer"
        ),
        remedy=(
            "size the host pool in absolute GB with --hicache-size (an absolute size per rank; "
            "--hicache-ratio is relative to the device KV pool, so a large device pool makes a "
            f"huge pinned host pool), or reduce --hicache-ratio{fits}"
        ),
        evidence=evidence + kills[:2],
        numbers=numbers,
    )


CGROUP_OOM = re.compile(r"Memory cgroup out of memory|OOMKilled")


LOAD_NOTE = re.compile(r"(?P<tokens>\d[\d,]*)-token\b.*?\bconcurrency (?P<concurrency>\d+)")


NEW_SEQ = re.compile(r"#new-seq: (?P<seqs>\d+),.*?#running-req: (?P<running>\d+)")


def host_oom_cgroup(bundle: Bundle) -> Diagnosis | None:
    """A container's memory limit (cgroup ``memory.max``), not the node's RAM, ran out: the
    kernel's ``Memory cgroup out of memory`` or the runtime's ``OOMKilled``. HiCache pools are
    booked against the whole host's free memory up to 0.5.20 (§2), so they can fill a limit."""
    facts = [line for s in bundle.snapshots() for line in s.get("kernel_log") or []]
    facts += bundle.notes()
    signs = [Evidence(text[:300], None, "snapshot") for text in facts if CGROUP_OOM.search(text)]
    signs += [bundle.evidence(hit) for hit in bundle.log.find(CGROUP_OOM)]
    if not signs:
        return None
    limit, samples = None, []
    for snapshot in bundle.snapshots():
        cgroup = snapshot.get("cgroup_memory") or {}
        if isinstance(cgroup.get("max_bytes"), int | float) and cgroup["max_bytes"] > 0:
            limit = cgroup["max_bytes"]
        if snapshot.get("phase") == "during" and isinstance(
            cgroup.get("current_bytes"), int | float
        ):
            samples.append((cgroup["current_bytes"], snapshot))
    tp = bundle.tp()
    numbers: dict[str, float] = {"tp_size": tp}
    parts = [f"container memory limit hit (TP {tp})"]
    if limit is not None:
        numbers["cgroup_limit_gib"] = round(limit / GiB, 2)
        parts[0] += f": cgroup memory.max is {limit / GiB:.0f} GiB"
    if samples and limit is not None:
        idle, peak = samples[0][0], max(samples, key=lambda s: s[0])
        numbers.update(
            idle_usage_gib=round(idle / GiB, 2),
            idle_fraction_of_limit=round(idle / limit, 2),
            peak_usage_gib=round(peak[0] / GiB, 2),
        )
        usage = (
            f"memory.current was {idle / GiB:.0f} GiB after start-up ({idle / limit:.2f} of the "
            f"limit) and {peak[0] / GiB:.0f} GiB at the peak"
        )
        load = next((LOAD_NOTE.search(str(n)) for n in peak[1].get("notes") or []), None)
        seqs = [int(m["seqs"]) + int(m["running"]) for _, m in bundle.log.find(NEW_SEQ)]
        if load is not None:
            numbers.update(
                load_tokens=int(load["tokens"].replace(",", "")),
                concurrency=int(load["concurrency"]),
            )
            usage += f" (under a {numbers['load_tokens']:g}-token load at concurrency "
            usage += f"{load['concurrency']})"
        elif seqs:
            numbers["concurrency"] = max(seqs)
            usage += f" (under load, up to {max(seqs)} requests at once)"
        parts.append(usage)
    pools = _host_pools(bundle)
    secondary, fits = [], ""
    if pools is not None:
        secondary = ["host-oom-hicache"]
        source, figures = _host_pool_source(bundle)
        numbers.update(figures, hicache_gb_total=pools.total)
        parts.append(
            f"{pools.ranks} ranks pin {pools.ranks} x {pools.each:.2f} GB = {pools.total:.2f} GB "
            f"of HiCache host pools ({source}) inside it"
        )
        if samples and limit is not None:
            # What the pools may take so that the observed peak stays under 80 % of the limit.
            other = samples[0][0] / 1e9 - pools.total
            growth = (max(s[0] for s in samples) - samples[0][0]) / 1e9
            room = math.floor((0.8 * limit / 1e9 - other - growth) / pools.ranks)
            if room > 0:
                numbers["suggested_hicache_size_gb"] = room
                fits = f" ({room} GB per rank here keeps the observed peak under 80 % of the limit)"
    return Diagnosis(
        category="host-oom-cgroup",
        secondary_categories=secondary,
        summary="; ".join(parts) + ", then the kernel OOM-killed the container's process",
        remedy=(
            "size HiCache against the cgroup memory.max (the container limit not host RAM): "
            f"lower --hicache-ratio or set --hicache-size{fits}; or raise the container's memory "
            "limit, and keep headroom for runtime growth"
        ),
        evidence=signs[:3] + ([bundle.evidence(h) for h in pools.hits[:2]] if pools else []),
        numbers=numbers,
    )
