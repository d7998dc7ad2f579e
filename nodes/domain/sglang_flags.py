"""SGLang's command line, per version: which flags exist, what they mean, how argparse reads them.

The tables come from ``ServerArgs.add_cli_args`` of each SGLang wheel (0.4.10.post2, 0.5.2,
0.5.9, 0.5.23; shared/reference/sglang-flags-by-version.tsv, copied to
``nodes/data/sglang-flags-by-version.tsv``). Parsing rebuilds SGLang's argparse parser from the
table, so prefix abbreviations (``--tp 8``) resolve, and fail as ambiguous, exactly as in SGLang.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from nodes.domain.env_policy import check_name

KNOWN_TABLES = ("0.4.10.post2", "0.5.2", "0.5.9", "0.5.23")
# Flags removed between versions, and what replaced them (shared/reference/sglang.md §7).
REPLACEMENTS = {
    "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode / --cuda-graph-max-bs-prefill",
    "--cuda-graph-bs": "--cuda-graph-bs-decode / --cuda-graph-bs-prefill",
    "--enable-ep-moe": "--ep-size",
    "--enable-deepep-moe": "--moe-a2a-backend deepep",
    "--enable-flashinfer-cutlass-moe": "--moe-runner-backend",
    "--enable-flashinfer-trtllm-moe": "--moe-runner-backend",
    "--enable-triton-kernel-moe": "--moe-runner-backend",
    "--disable-hicache-numa-detect": "nothing (removed)",
}
LIST_DESTS = {"cuda_graph_bs", "cuda_graph_bs_decode", "cuda_graph_bs_prefill", "lora_paths"}
LAUNCHERS = (["-m", "sglang.launch_server"], ["sglang", "serve"])


@dataclass(frozen=True)
class FlagSpec:
    """One option of one version: its option strings, dest, type name, action, default."""

    options: tuple[str, ...]
    dest: str
    type: str
    action: str
    default: Any
    choices: tuple[str, ...]


@dataclass(frozen=True)
class FlagTable:
    """Every option of one SGLang version."""

    version: str
    flags: tuple[FlagSpec, ...]


@dataclass(frozen=True)
class FlagIssue:
    """A problem with one flag: ``code`` (unknown, renamed, invalid), the flag, the words."""

    code: str
    flag: str
    message: str


@dataclass
class ParsedCommand:
    """``values`` maps dest → value for every flag of the version (defaults included);
    ``given`` holds the dests the command set; ``issues`` what SGLang would refuse."""

    values: dict[str, Any] = field(default_factory=dict)
    given: set[str] = field(default_factory=set)
    issues: list[FlagIssue] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def get(self, *dests: str, default: Any = None) -> Any:
        for dest in dests:
            if dest in self.values:
                value = self.values[dest]
                return default if value is None else value
        return default


def parse_table(text: str) -> dict[str, FlagTable]:
    """Read the TSV (``version, options, dest, type, action, default, choices``) into tables."""
    rows: dict[str, list[FlagSpec]] = {}
    header: list[str] | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        cells = line.split("\t")
        if header is None:
            header = cells
            continue
        row = dict(zip(header, cells, strict=False))
        rows.setdefault(row["version"], []).append(
            FlagSpec(
                options=tuple(row["options"].split("|")),
                dest=row["dest"],
                type=row["type"],
                action=row["action"],
                default=_literal(row["default"]),
                choices=tuple(c for c in row.get("choices", "").split(",") if c),
            )
        )
    return {version: FlagTable(version, tuple(specs)) for version, specs in rows.items()}


def _literal(text: str) -> Any:
    if text in ("", "None"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


#: What an SGLang version string looks like (``0.5.9``, ``0.4.10.post2``, ``0.5.0rc1``): text
#: from elsewhere (a bundle, an import) is checked against it before it is parsed as one.
VERSION_TEXT = re.compile(r"\d{1,4}(?:\.\d{1,6}){0,3}(?:[.+-]?[A-Za-z][A-Za-z0-9]{0,15}){0,3}")


def version_key(version: str) -> tuple[int, ...]:
    """``"0.5.9"`` → ``(0, 5, 9)``; ``"0.4.10.post2"`` → ``(0, 4, 10)``."""
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def table_for(version: str) -> str:
    """The newest table no newer than ``version`` (oldest table for older versions)."""
    wanted = version_key(version)
    eligible = [v for v in KNOWN_TABLES if version_key(v) <= wanted]
    return eligible[-1] if eligible else KNOWN_TABLES[0]


class _Refused(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and exit(2)
        raise _Refused(message)


def _human_int(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * units[suffix])
    return int(text)


def _loads(text: str) -> Any:
    return json.loads(text)


_TYPES: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "loads": _loads,
    "json_list_type": _loads,
    "human_readable_int": _human_int,
}


def build_parser(table: FlagTable) -> argparse.ArgumentParser:
    """SGLang's parser for the table's version (types, actions, choices, abbreviations)."""
    parser = _Parser(prog="launch_server.py", add_help=False)
    for spec in table.flags:
        options = list(spec.options)
        kwargs: dict[str, Any] = {"dest": spec.dest, "default": spec.default}
        if spec.action in ("_StoreTrueAction", "DeprecatedStoreTrueAction", "DeprecatedAction"):
            kwargs["action"] = "store_true"
        elif spec.action == "DeprecatedStoreConstAction":
            kwargs.update(action="store_const", const=True)
        elif spec.action == "BooleanOptionalAction":
            kwargs["action"] = argparse.BooleanOptionalAction
            options = [o for o in options if not o.startswith("--no-")]
        else:
            kwargs["type"] = _TYPES.get(spec.type, str)
            if spec.choices:
                kwargs["choices"] = (
                    [int(c) for c in spec.choices] if spec.type == "int" else list(spec.choices)
                )
            if spec.dest in LIST_DESTS or spec.action == "LoRAPathAction":
                kwargs["nargs"] = "+"
        parser.add_argument(*options, **kwargs)
    return parser


def split_command(command: str | list[str]) -> tuple[list[str], dict[str, str]]:
    """A pasted launch command → (flags after the launcher, leading ``VAR=value`` settings).

    Accepts ``python3 -m sglang.launch_server …``, ``sglang serve …`` or bare flags, after
    ``VAR=value`` or ``export VAR=value`` settings; raises ``ValueError`` for unbalanced quotes,
    a variable name ``env_policy.check_name`` refuses, and for anything else before the
    launcher (``cd /x &&``, ``sudo``), which would not run.
    """
    words = shlex.split(command.replace("\\\n", " ")) if isinstance(command, str) else list(command)
    env: dict[str, str] = {}
    if words[:1] == ["env"]:
        words.pop(0)
    while words and (words[0] == "export" or ("=" in words[0] and not words[0].startswith("-"))):
        word = words.pop(0)
        if word == "export":
            continue
        key, _, value = word.partition("=")
        if problem := check_name(key):  # a shell would run ``ÄÖ=1`` as a command, not set it
            raise ValueError(problem)
        env[key] = value
    for launcher in LAUNCHERS:
        for i in range(len(words) - len(launcher) + 1):
            if words[i : i + len(launcher)] == launcher:
                if not _runs_launcher(words[:i], launcher):
                    raise ValueError(
                        f"{shlex.join(words[:i])[:80]!r} before the launcher would not be run; "
                        "paste only VAR=value settings and the command"
                    )
                return words[i + len(launcher) :], env
    return words, env


def _runs_launcher(prefix: list[str], launcher: list[str]) -> bool:
    """Only an interpreter (``python3``, ``/opt/venv/bin/python``, with its own ``-X`` style
    options) may stand before ``-m sglang.launch_server``; nothing before ``sglang serve``."""
    if launcher[0] != "-m":
        return not prefix
    return (
        bool(prefix)
        and re.fullmatch(r"python[0-9.]*", prefix[0].rsplit("/", 1)[-1]) is not None
        and all(word.startswith("-") for word in prefix[1:])
    )


def parse_command(argv: list[str], table: FlagTable) -> ParsedCommand:
    """Parse flags as the table's SGLang version would; collect what it would refuse."""
    parser = build_parser(table)
    result = ParsedCommand()
    try:
        namespace, unknown = parser.parse_known_args(argv)
    except _Refused as exc:
        flag = _flag_in(exc.message)
        message = exc.message
        if flag in REPLACEMENTS:
            message += f" ({flag} was removed; use {REPLACEMENTS[flag]})"
        result.issues.append(FlagIssue("invalid", flag, message))
        return result
    result.values = vars(namespace)
    result.given = {
        spec.dest
        for spec in table.flags
        if any(_mentions(argv, option) for option in spec.options)
        or _abbreviates(argv, spec, parser)
    }
    strays = [w for w in unknown if not w.startswith("--")]
    if strays:
        result.issues.append(
            FlagIssue("unknown", strays[0], f"unrecognized arguments: {' '.join(strays)[:200]}")
        )
    for word in unknown:
        if not word.startswith("--"):
            continue
        flag = word.split("=", 1)[0]
        if flag in REPLACEMENTS:
            result.issues.append(
                FlagIssue(
                    "renamed",
                    flag,
                    f"{flag} does not exist in SGLang {table.version}; use {REPLACEMENTS[flag]}",
                )
            )
        else:
            result.issues.append(
                FlagIssue("unknown", flag, f"{flag} is not a flag of SGLang {table.version}")
            )
    if result.get("disable_radix_cache") and result.get("enable_hierarchical_cache"):
        result.issues.append(
            FlagIssue(
                "invalid",
                "--disable-radix-cache",
                "--disable-radix-cache and --enable-hierarchical-cache are mutually exclusive",
            )
        )
    if "model_path" not in result.given:
        result.issues.append(FlagIssue("invalid", "--model-path", "--model-path is required"))
    return result


def _mentions(argv: list[str], option: str) -> bool:
    return any(w == option or w.startswith(option + "=") for w in argv)


def _abbreviates(argv: list[str], spec: FlagSpec, parser: argparse.ArgumentParser) -> bool:
    for word in argv:
        flag = word.split("=", 1)[0]
        if not flag.startswith("--") or flag in parser._option_string_actions:
            continue
        matches = [o for o in parser._option_string_actions if o.startswith(flag)]
        if len(matches) == 1 and matches[0] in spec.options:
            return True
    return False


def _flag_in(message: str) -> str:
    for word in message.replace(":", " ").split():
        if word.startswith("--"):
            return word.rstrip(",")
    return ""
