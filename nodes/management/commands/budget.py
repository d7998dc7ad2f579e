"""``manage.py budget --node NODE.json [...] --json -- python3 -m sglang.launch_server FLAGS``.

Checks a launch command against a node's memory, per TP rank, without touching any node.
Exit 0 for ``ok``/``warn``, 1 for ``block`` (with the report), 2 when the budget command itself
is unusable (missing file, unreadable JSON), with a one-line reason on stderr.

Observed figures replace the estimates (and ``--weights-bytes`` is then not needed):
``--free-before-load-bytes`` (SGLang's ``Load weight begin. avail mem=``, the minimum across the
chosen GPUs) and ``--weights-per-rank-bytes`` (``Load weight end. … mem usage=``). The JSON adds
``weights_bytes_per_rank``, ``free_before_load_bytes`` and ``calibration`` (what they came from).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser
from packaging.version import InvalidVersion, Version

from nodes.domain import calibration
from nodes.domain.budget import NodeMemory, Observed, check
from nodes.domain.budget_types import json_size_or_none
from nodes.domain.geometry import GeometryError, from_config
from nodes.domain.sglang_flags import ParsedCommand, parse_command, split_command
from nodes.flag_tables import table
from nodes.management.cli import OneLineCommand

DEFAULT_VERSION = "0.5.9"


class Command(OneLineCommand):
    help = "Check an SGLang launch command against a node's GPU and host memory."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--node", required=True, help="NODE.json: name, host_ram_bytes, gpus")
        parser.add_argument("--model-config", help="The model's config.json")
        parser.add_argument("--weights-bytes", type=int, help="Checkpoint size in bytes")
        parser.add_argument("--available-bytes", type=int, help="MemAvailable now, in bytes")
        parser.add_argument(
            "--free-before-load-bytes",
            type=int,
            help="Observed free GPU memory before weights (Load weight begin. avail mem=), bytes",
        )
        parser.add_argument(
            "--weights-per-rank-bytes",
            type=int,
            help="Observed weights per rank (Load weight end. mem usage=), bytes",
        )
        parser.add_argument(
            "--calibrate-from",
            metavar="LOG",
            help="An SGLang start-up log of this model on this GPU model and TP: its Load weight "
            "begin/end lines give the free memory before load and the weights per rank",
        )
        parser.add_argument("--sglang-version", help=f"Default: the node's, else {DEFAULT_VERSION}")
        parser.add_argument("--json", action="store_true", help="Print one JSON document")
        parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python3 -m sglang…")

    def handle(self, *args: Any, **options: Any) -> None:
        node_doc = _read_json(options["node"], "--node")
        if not isinstance(node_doc, dict):
            raise CommandError("--node: expected a JSON object", returncode=2)
        config = (
            _read_json(options["model_config"], "--model-config")
            if options["model_config"]
            else None
        )
        command = [w for w in options["command"] if w != "--"] if options["command"] else []
        if not command:
            raise CommandError("give the launch command after --", returncode=2)
        # Each size option is checked on its own, so a refusal names the one at fault.
        sizes: dict[str, int | None] = {}
        for option in (
            "available_bytes",
            "weights_bytes",
            "free_before_load_bytes",
            "weights_per_rank_bytes",
        ):
            try:
                sizes[option] = json_size_or_none(options[option])
            except ValueError:
                flag = "--" + option.replace("_", "-")
                raise CommandError(
                    f"{flag} {options[option]}: a size in bytes, 0 to 2^63", returncode=2
                ) from None
        try:
            memory = NodeMemory.from_document(node_doc, sizes["available_bytes"])
        except ValueError:
            raise CommandError(
                '--node: expected {"host_ram_bytes": int, "gpus": [{"memory_total_bytes": int}]} '
                "with sizes in bytes (0 to 2^63)",
                returncode=2,
            ) from None
        smallest = min((g for g in memory.gpu_memory_bytes if g), default=None)
        free = sizes["free_before_load_bytes"]
        if free is not None and smallest is not None and free > smallest:
            raise CommandError(
                f"--free-before-load-bytes {free:,} is more than a GPU of --node has "
                f"({smallest:,} bytes): SGLang's avail mem= is what one GPU had free",
                returncode=2,
            )
        weights = sizes["weights_bytes"]
        observed = Observed(
            free_before_load_bytes=free, weights_per_rank_bytes=sizes["weights_per_rank_bytes"]
        )
        version = str(
            options["sglang_version"] or node_doc.get("sglang_version") or DEFAULT_VERSION
        )
        try:
            Version(version)
        except InvalidVersion:
            raise CommandError(
                f"--sglang-version {version[:40]!r} is not a version (PEP 440, e.g. 0.5.9rc1)",
                returncode=2,
            ) from None
        try:
            argv, env = split_command(command)
        except ValueError as exc:
            raise CommandError(f"the launch command cannot be split: {exc}", returncode=2) from None
        flags = parse_command(argv, table(version))
        flags.env = env
        if options["calibrate_from"]:
            observed = _calibrated(options["calibrate_from"], observed, flags)
        geometry = None
        if config is not None:
            try:
                geometry = from_config(config)
            except GeometryError as exc:
                raise CommandError(f"--model-config: {exc}", returncode=2) from None
        report = check(
            flags,
            memory,
            version=version,
            geometry=geometry,
            weights_bytes=weights,
            observed=observed,
        )
        if options["json"]:
            doc = report.to_json()
            doc["sglang_version"] = version
            self.stdout.write(json.dumps(doc, indent=2))
        else:
            self.stdout.write(f"Verdict: {report.verdict.upper()} (SGLang {version})")
            for line in report.lines:
                self.stdout.write(f"  {line}")
            for message in report.messages:
                self.stdout.write(f"  [{message.level}] {message.text}")
        if report.verdict == "block":
            raise SystemExit(1)


def _calibrated(path: str, given: Observed, flags: ParsedCommand) -> Observed:
    """Figures from a start-up log of the same model and TP size as ``flags``; ones given on
    the command line win."""
    try:
        with open(path, errors="replace") as handle:
            figures = calibration.parse(handle)
        calibration.check_fits(
            figures,
            str(flags.get("model_path", default="") or ""),
            int(flags.get("tp_size", "tensor_parallel_size", default=1)),
        )
    except OSError as exc:
        raise CommandError(
            f"--calibrate-from: cannot read {path}: {exc.strerror}", returncode=2
        ) from None
    except calibration.CalibrationError as exc:
        raise CommandError(f"--calibrate-from: {path}: {exc}", returncode=2) from None
    name = Path(path).name
    weights = figures.weights_per_rank_bytes / 2**30
    return Observed(
        free_before_load_bytes=given.free_before_load_bytes or figures.free_before_load_bytes,
        weights_per_rank_bytes=given.weights_per_rank_bytes or figures.weights_per_rank_bytes,
        label=f"calibrated from {name}: {weights:.2f} GiB of weights per rank",
        kind="calibrated",
    )


def _read_json(path: str, flag: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise CommandError(f"{flag}: cannot read {path}: {exc.strerror}", returncode=2) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CommandError(f"{flag}: {path} is not JSON ({exc})", returncode=2) from None
    except (RecursionError, ValueError):
        raise CommandError(
            f"{flag}: {path} is not usable JSON (too deep or too large)", returncode=2
        ) from None
