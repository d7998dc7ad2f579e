"""Estimate vs observed for every real SGLang start-up in ``tests/fixtures/kv/observations.json``.

Run from the project folder: ``.venv/bin/python -m benchmarks.kv_observations [--legacy]``.
Each observation's logged figures (free memory before load, weights per rank, mem-fraction, TP,
page size, KV dtype, ``--max-total-tokens``) are given to ``manage.py budget`` with the model's
config.json from ``tests/fixtures/kv/models.json``, and its device KV token count is compared
with the one the log shows. Prints a Markdown table (the one in ``benchmarks/RESULTS.md``).

``--legacy`` feeds the same figures through the options the budget command had before
``--free-before-load-bytes``/``--weights-per-rank-bytes`` existed (a GPU of free-before-load +
1 GiB, since the old engine took 1 GiB of CUDA context off the card, and a checkpoint of weights
per rank × TP × PP): that is how the "before" column was made.

Where the free memory before load is not logged but the memory after loading and the weights
are, it is derived as their sum (SGLang prints ``mem usage`` as the difference of the two);
such rows say "derived".
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "kv"
GiB = 2**30
DEFAULT_VERSION = "0.5.9"


@dataclass(frozen=True)
class Observation:
    """One start-up: the figures SGLang logged, in bytes and counts, and what it allocated."""

    id: str
    model: str
    tp: int
    pp: int
    dp: int
    dp_attention: bool
    mem_fraction: float | None
    page_size: int | None
    kv_cache_dtype: str | None
    max_total_tokens: int | None
    free_before_load: int | None
    free_source: str | None  # "logged", "derived" (after load + weights) or None
    weights_per_rank: int | None
    observed_tokens: int | None
    config: dict[str, Any] | None
    version: str
    gpu_total: int | None

    @property
    def logged(self) -> bool:
        """The acceptance set: free memory before load, weights and mem-fraction all logged."""
        return (
            self.free_source == "logged"
            and self.weights_per_rank is not None
            and self.mem_fraction is not None
        )

    @property
    def complete(self) -> bool:
        """Enough figures to estimate: free before load (logged or derived), weights, fraction."""
        return (
            self.free_before_load is not None
            and self.weights_per_rank is not None
            and self.mem_fraction is not None
        )


def _gib(value: float | None) -> int | None:
    return None if value is None else round(value * GiB)


def _dtype(text: str | None) -> str | None:
    if not text:
        return None
    word = text.split()[0]
    return "fp8_e4m3" if word == "fp8" else word


def observations() -> list[Observation]:
    """Every observation of the fixture, in file order."""
    data = json.loads((FIXTURES / "observations.json").read_text())
    configs = json.loads((FIXTURES / "models.json").read_text())["configs"]
    found = []
    for o in data["observations"]:
        lines = " ".join(o["quoted_lines"])
        cap = re.search(r"max_total_tokens=(\d+)", lines)
        pre = _gib(o["avail_mem_before_load_gb"])
        source = "logged" if pre is not None else None
        weights = _gib(o["weights_mem_usage_gb"])
        after = _gib(o["avail_mem_after_load_gb"])
        if pre is None and weights is not None and after is not None:
            pre, source = after + weights, "derived"
        observed = o["max_total_num_tokens"] if o["max_total_num_tokens"] else o["kv_tokens"]
        version = re.search(r"(\d+\.\d+\.\d+)", o["sglang_version"] or "")
        found.append(
            Observation(
                id=o["id"],
                model=(o["model"] or "(not named)").split(" (")[0],
                tp=o["tp_size"] or 1,
                pp=o["pp_size"] or 1,
                dp=o["dp_size"] or 1,
                dp_attention=bool(o["enable_dp_attention"]),
                mem_fraction=o["mem_fraction_static"],
                page_size=o["page_size"],
                kv_cache_dtype=_dtype(o["kv_cache_dtype"]),
                max_total_tokens=int(cap.group(1)) if cap else None,
                free_before_load=pre,
                free_source=source,
                weights_per_rank=weights,
                observed_tokens=observed,
                config=configs.get(o["id"]),
                version=version.group(1) if version else DEFAULT_VERSION,
                gpu_total=_gib(o["gpu_memory_total_gib"]),
            )
        )
    return found


def launch_command(obs: Observation) -> list[str]:
    """The SGLang command line the observation ran (the memory-relevant flags)."""
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", str(obs.tp)]
    if obs.pp > 1:
        argv += ["--pp-size", str(obs.pp)]
    if obs.dp > 1:
        argv += ["--dp-size", str(obs.dp)]
        if obs.dp_attention:
            argv.append("--enable-dp-attention")
    if obs.mem_fraction is not None:
        argv += ["--mem-fraction-static", str(obs.mem_fraction)]
    if obs.page_size:
        argv += ["--page-size", str(obs.page_size)]
    if obs.kv_cache_dtype:
        argv += ["--kv-cache-dtype", obs.kv_cache_dtype]
    if obs.max_total_tokens:
        argv += ["--max-total-tokens", str(obs.max_total_tokens)]
    return argv


def run_budget(obs: Observation, workdir: Path, *, legacy: bool = False) -> dict[str, Any]:
    """``manage.py budget --json`` for the observation; returns the JSON document plus
    ``returncode`` (and ``stderr`` when the command was unusable)."""
    assert obs.free_before_load is not None and obs.weights_per_rank is not None
    gpu = obs.gpu_total or obs.free_before_load + GiB
    node = workdir / f"{obs.id}-node.json"
    node.write_text(
        json.dumps(
            {"name": obs.id, "host_ram_bytes": 2**40, "gpus": [{"memory_total_bytes": gpu}] * 8}
        )
    )
    args = ["--node", str(node), "--sglang-version", obs.version, "--json"]
    if obs.config is not None:
        config = workdir / f"{obs.id}-config.json"
        config.write_text(json.dumps(obs.config))
        args += ["--model-config", str(config)]
    if legacy:
        args += ["--weights-bytes", str(obs.weights_per_rank * obs.tp * obs.pp)]
    else:
        args += [
            "--free-before-load-bytes",
            str(obs.free_before_load),
            "--weights-per-rank-bytes",
            str(obs.weights_per_rank),
        ]
    result = subprocess.run(
        [sys.executable, "manage.py", "budget", *args, "--", *launch_command(obs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode == 2:
        return {"returncode": 2, "stderr": result.stderr.strip()}
    doc: dict[str, Any] = json.loads(result.stdout)
    doc["returncode"] = result.returncode
    return doc


def unavailable_reason(doc: dict[str, Any]) -> str | None:
    """The engine's explicit refusal ("estimate unavailable: …"), if it gave one."""
    for message in doc.get("messages", []):
        if message["text"].startswith("estimate unavailable:"):
            return str(message["text"])
    return None


def row(obs: Observation, workdir: Path, *, legacy: bool) -> tuple[str, str, str]:
    """(estimate, error, note) for the table."""
    if obs.observed_tokens is None:
        return "—", "—", "no token count logged"
    if not obs.complete:
        missing = [
            name
            for name, value in (
                ("free memory before load", obs.free_before_load),
                ("weights", obs.weights_per_rank),
                ("mem-fraction", obs.mem_fraction),
            )
            if value is None
        ]
        return "—", "—", "not logged: " + ", ".join(missing)
    doc = run_budget(obs, workdir, legacy=legacy)
    if doc["returncode"] == 2:
        return "—", "—", f"command refused: {doc['stderr'][:80]}"
    tokens = doc.get("device_kv_tokens_per_rank")
    if tokens is None:
        reason = unavailable_reason(doc)
        if reason:
            return "unavailable", "—", reason
        if obs.config is None:
            return "none", "—", "no config.json for this model in tests/fixtures/kv/models.json"
        codes = ", ".join(m["code"] for m in doc.get("messages", []) if m["level"] != "info")
        return "none", "—", codes or "no estimate and no reason"
    error = (tokens - obs.observed_tokens) / abs(obs.observed_tokens) * 100
    return f"{tokens:,}", f"{error:+.1f} %", ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--legacy", action="store_true", help="the options from before issue 15")
    args = parser.parse_args()
    print("| id | model | TP | free before load | figures | observed | estimate | error | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    within = total = 0
    with tempfile.TemporaryDirectory(prefix="rankwise-kv-") as tmp:
        for obs in observations():
            estimate, error, note = row(obs, Path(tmp), legacy=args.legacy)
            pre = (
                f"{obs.free_before_load / GiB:.2f} GiB ({obs.free_source})"
                if obs.free_before_load is not None
                else "—"
            )
            figures = "all logged" if obs.logged else ("derived" if obs.complete else "partial")
            observed = f"{obs.observed_tokens:,}" if obs.observed_tokens is not None else "—"
            print(
                f"| {obs.id} | {obs.model} | {obs.tp} | {pre} | {figures} | {observed} | "
                f"{estimate} | {error} | {note} |"
            )
            if obs.logged:
                total += 1
                within += error != "—" and abs(float(error.split()[0])) <= 1.0
    print(f"\nAcceptance set (all figures logged): {within} of {total} within 1 %.")
    if not args.legacy:
        seed()


def seed() -> None:
    """The seed incident's server (S01): Kimi-K2.5 INT4, TP8, 8 × RTX PRO 6000, 595 GB."""
    facts = json.loads((ROOT / "tests/fixtures/cases/S01/facts.json").read_text())
    print("\n| seed (S01) | weights per rank | free before load | tokens | observed | error |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="rankwise-kv-") as tmp:
        node, config = Path(tmp, "node.json"), Path(tmp, "config.json")
        node.write_text(json.dumps(facts["node"]))
        config.write_text(json.dumps(facts["model_config"]))
        for mfs, observed, extra in (
            ("0.85", 116_171, []),
            ("0.93", 238_007, []),
            (
                "0.93",
                238_007,
                [
                    "--free-before-load-bytes",
                    str(round(94.62 * GiB)),
                    "--weights-per-rank-bytes",
                    str(round(72.42 * GiB)),
                ],
            ),
        ):
            command = [
                "python3",
                "-m",
                "sglang.launch_server",
                "--model-path",
                "/m",
                "--tp-size",
                "8",
                "--mem-fraction-static",
                mfs,
            ]
            result = subprocess.run(
                [
                    sys.executable,
                    "manage.py",
                    "budget",
                    "--node",
                    str(node),
                    "--model-config",
                    str(config),
                    "--weights-bytes",
                    str(595 * 10**9),
                    "--json",
                    *extra,
                    "--",
                    *command,
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            doc = json.loads(result.stdout)
            tokens = doc["device_kv_tokens_per_rank"]
            how = doc["calibration"]["source"]
            print(
                f"| mfs {mfs}, {how} | {doc['weights_bytes_per_rank'] / GiB:.2f} GiB | "
                f"{doc['free_before_load_bytes'] / GiB:.2f} GiB | {tokens:,} | {observed:,} | "
                f"{(tokens - observed) / observed * 100:+.1f} % |"
            )


if __name__ == "__main__":
    main()
