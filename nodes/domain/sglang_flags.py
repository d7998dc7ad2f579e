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

from packaging.version import VERSION_PATTERN, InvalidVersion, Version

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


#: What an SGLang version string looks like: a PEP 440 version (``0.5.9``, ``0.4.10.post2``,
#: ``0.5.0rc1``, ``0.5.9+cu124``) of at most 32 characters (the column's width). Text from
#: elsewhere (a bundle, an import) is checked against it (``fullmatch``) before it is used.
VERSION_TEXT = re.compile(r"(?=.{1,32}\Z)" + VERSION_PATTERN, re.VERBOSE | re.IGNORECASE)


#: An odd version's leading release numbers, and a pre- or dev-release marker right after them
#: (PEP 440's spellings, with ``~`` as Debian writes it): ``0.5.9rc1-custom``, ``0.5.9~rc1``,
#: ``0.5.9.dev3-x``. The marker must end there (``0.5.9-custom`` has none: ``c`` + ``ustom``).
ODD_VERSION = re.compile(
    r"[vV]?(?P<release>\d{1,9}(?:\.\d{1,9}){0,3})"
    r"(?:[-_.~ ]?(?P<pre>alpha|beta|preview|pre|rc|dev|a|b|c)(?![a-z])[-_.]?(?P<n>\d{0,9}))?",
    re.IGNORECASE,
)


def sglang_version(text: str) -> Version:
    """``"0.5.9rc0"`` → ``Version("0.5.9rc0")``, ordered as pip orders releases (PEP 440): a
    pre-release or dev release of X comes before X, a post-release or local build after it.

    Text that is not PEP 440 (``0.5.9-custom``, a node's odd build) is read by its leading
    release numbers, and a pre- or dev-release marker right after them keeps it before its
    release (``0.5.9rc1-custom`` → ``0.5.9rc1``, ``0.5.9~rc1`` → ``0.5.9rc1``); raises
    ``ValueError`` when it has no release numbers.
    """
    try:
        return Version(text)
    except InvalidVersion:
        odd = ODD_VERSION.match(text.strip())
        if odd is None:
            raise ValueError(f"{text[:32]!r} is not a version") from None
        if odd["pre"] is None:
            return Version(odd["release"])
        marker = odd["pre"].lower()
        joiner = "." if marker == "dev" else ""
        return Version(f"{odd['release']}{joiner}{marker}{odd['n'] or 0}")


def table_for(version: str) -> str:
    """The newest table no newer than ``version`` (oldest table for older versions).

    So ``0.5.9rc0`` gets 0.5.2's table (its release candidate may lack what 0.5.9 added) and
    ``0.5.23.post1`` or ``0.5.9+cu124`` the release's own; unreadable text gets the oldest.
    """
    try:
        wanted = sglang_version(version)
    except ValueError:
        return min(KNOWN_TABLES, key=Version)
    eligible = [v for v in KNOWN_TABLES if Version(v) <= wanted]
    return max(eligible, key=Version) if eligible else min(KNOWN_TABLES, key=Version)


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

    Accepts ``python3 -m sglang.launch_server …`` (with the interpreter options of
    ``PYTHON_OPTIONS``), ``sglang serve …`` or bare flags, after ``VAR=value`` or
    ``export VAR=value`` settings; raises ``ValueError`` for unbalanced quotes, for any other
    interpreter option (``-c CODE``, ``-W …``, ``-X …``), for a variable name
    ``env_policy.check_name`` refuses, and for anything else before the
    launcher (``cd /x &&``, ``sudo``), which would not be run as pasted.
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
    if (
        words
        and PYTHON.fullmatch(words[0].rsplit("/", 1)[-1])
        and any(w.endswith(LAUNCHERS[0][1]) for w in words)
    ):
        # The interpreter's options are read one by one only when it is to run SGLang's
        # server; another program's command (``python -m vllm…`` in a bundle) falls through
        # as it is: its words are no SGLang flags, which a profile refuses anyway.
        return words[_after_python_options(words) :], env
    for launcher in LAUNCHERS:
        for i in range(len(words) - len(launcher) + 1):
            if words[i : i + len(launcher)] == launcher:
                if i:
                    raise ValueError(_before_the_launcher(words[:i]))
                return words[i + len(launcher) :], env
    return words, env


def _before_the_launcher(words: list[str]) -> str:
    """Why words before the launcher are refused, in the words the operator pasted (the
    interpreter that belongs to the launcher left out), and what each kind would have done."""
    if words and PYTHON.fullmatch(words[-1].rsplit("/", 1)[-1]):
        words = words[:-1]
    shown = " ".join(words)
    shown = shown if len(shown) <= 80 else shown[:79] + "…"
    why = [f"“{shown}” before the launcher would not be run: paste only VAR=value settings and "
           "the command"]  # fmt: skip
    if "sudo" in words or "su" in words:
        why.append(
            "sudo is not needed: servers run as the node's user (node page → Run servers as)"
        )
    if any(w in ("cd", "pushd") or w.endswith(("&&", ";", "||", "|")) for w in words):
        why.append(
            "a shell's cd or && is not needed: the server runs in its own folder on the node"
        )
    return "; ".join(why)


PYTHON = re.compile(r"python[0-9.]*")
#: Interpreter options allowed before ``-m sglang.launch_server``: they only change output
#: buffering, .pyc writing, or make Python ignore the node's PYTHON* variables and user
#: site-packages; none runs, imports or writes anything the operator did not ask for, and none
#: changes how SGLang reads its flags. Everything else is refused: ``-c`` runs its own code
#: instead of the server, ``-W`` filters and ``-X`` options can import modules or write files,
#: ``-O`` strips the assertions SGLang checks its memory with, ``-i``/``-h``/``-V`` never start
#: the server.
PYTHON_OPTIONS = {
    "u": "unbuffered output",
    "B": "no .pyc files",
    "E": "ignore PYTHON* variables",
    "s": "no user site-packages",
    "I": "isolated mode",
    "P": "no unsafe sys.path entry",
}
PYTHON_X_OPTIONS = ("faulthandler", "utf8", "utf8=0", "utf8=1")
_PYTHON_REFUSALS = {
    "c": "-c runs the code given after it, not the server",
    "W": "-W warning filters can import any module",
}


def _after_python_options(words: list[str]) -> int:
    """Where SGLang's flags start in ``python3 [OPTIONS] -m sglang.launch_server FLAGS``, read
    as CPython reads its options (grouped letters ``-uB``, glued values ``-msglang…``, ``-X``
    taking the next word); raises ``ValueError`` naming the first refused word."""
    allowed = " ".join(f"-{o}" for o in PYTHON_OPTIONS) + ", -X faulthandler, -X utf8"
    i = 1
    while i < len(words):
        word = words[i]
        if word.startswith("--") and word != "--":
            raise ValueError(
                f"the interpreter option {word[:40]} is refused (allowed before -m "
                f"sglang.launch_server: {allowed})"
            )
        if not word.startswith("-") or word in ("-", "--"):
            raise ValueError(f"python would run {word[:40]!r} instead of -m sglang.launch_server")
        for j, letter in enumerate(word[1:], start=1):
            if letter in PYTHON_OPTIONS:
                continue
            if letter not in "mXcW":
                raise ValueError(
                    f"the interpreter option -{letter} is refused (allowed before -m "
                    f"sglang.launch_server: {allowed})"
                )
            value = word[j + 1 :]
            if not value:
                i += 1
                value = words[i] if i < len(words) else ""
            if letter == "m":
                if value != "sglang.launch_server":
                    raise ValueError(
                        f"-m {value[:40]} is not SGLang's server: use -m sglang.launch_server"
                    )
                return i + 1
            if letter == "X" and value in PYTHON_X_OPTIONS:
                break
            reason = _PYTHON_REFUSALS.get(letter, "-X options can import modules or write files")
            raise ValueError(
                f"the interpreter option -{letter} {value[:40]!r} is refused: {reason} "
                f"(allowed before -m sglang.launch_server: {allowed})"
            )
        i += 1
    raise ValueError("the interpreter is not given -m sglang.launch_server")


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
    named = {w.split("=", 1)[0] for w in argv if w.startswith("-")}
    result.given = {
        spec.dest for spec in table.flags if any(option in named for option in spec.options)
    } | _abbreviated(named, parser)
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
    result.issues += _port_issues(result.values, table)
    return result


def is_port_flag(spec: FlagSpec) -> bool:
    """Flags that name TCP ports, read from the table: ``--port`` and every dest ending in
    ``_port`` (``--nccl-port``, ``--grpc-port``…) or ``_ports`` (a JSON list of ports)."""
    return spec.dest == "port" or spec.dest.endswith(("_port", "_ports"))


def is_address_flag(spec: FlagSpec) -> bool:
    """Flags that name a ``HOST:PORT`` address, read from the table: every dest ending in
    ``_addr`` or ``_address`` (``--dist-init-addr``, alias ``--nccl-init-addr``)."""
    return spec.dest.endswith(("_addr", "_address"))


#: With DP attention SGLang's ZMQ sockets are TCP: from ``--dist-init-addr``'s port, else from
#: ``--port`` + 233 on one node (``ZMQ_TCP_PORT_DELTA``), taking that port + 1 … + 4 + dp size
#: (shared/reference/sglang.md §1b; ``server_args.py @0.5.2 :2633-2650``).
ZMQ_TCP_PORT_DELTA = 233


def address_port(address: str) -> str | None:
    """The port text of ``HOST:PORT`` (``[v6]:PORT`` too), ``None`` when none is given."""
    host, colon, port = address.rpartition(":")
    if not colon or not host or host.endswith(":") or not re.fullmatch(r"[+-]?\d+", port):
        return None
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return None  # ``a:80:90``: SGLang splits at ":" and would not read it
    return port


def derived_ports(values: dict[str, Any]) -> tuple[int, str, str] | None:
    """``(highest port, how it is derived, the flag it comes from)`` for the TCP ports SGLang
    derives from the command's ports, when it derives any: with DP attention
    (``--enable-dp-attention``, or 0.5.23's ``--attn-dp-size`` > 1) the ZMQ ports run up to the
    base port + 4 + the DP size, the base being ``--dist-init-addr``'s port, else ``--port`` +
    ``ZMQ_TCP_PORT_DELTA``."""
    attn_dp = values.get("attn_dp_size")
    attn_dp = attn_dp if isinstance(attn_dp, int) and attn_dp > 1 else None
    if not values.get("enable_dp_attention") and attn_dp is None:
        return None
    dp = attn_dp or values.get("dp_size") or values.get("data_parallel_size")
    dp = dp if isinstance(dp, int) and dp > 0 else 1
    given = address_port(str(values.get("dist_init_addr") or ""))
    if given is not None:
        base, how, flag = int(given), f"--dist-init-addr's port {given}", "--dist-init-addr"
    else:
        port = values.get("port")
        port = port if isinstance(port, int) else 30000
        base, how, flag = (
            port + ZMQ_TCP_PORT_DELTA,
            f"--port {port} + {ZMQ_TCP_PORT_DELTA}",
            "--port",
        )
    return base + 4 + dp, f"{how} + 4 + DP size {dp}", flag


def _port_number(port: Any) -> int | None:
    if isinstance(port, int) and not isinstance(port, bool):
        return port
    if isinstance(port, str) and re.fullmatch(r"[+-]?\d+", port.strip()):
        return int(port)
    return None


def _port_issues(values: dict[str, Any], table: FlagTable) -> list[FlagIssue]:
    """SGLang takes any integer for a port and fails only when it binds; refuse at once what no
    TCP server can listen on (0, negatives, above 65535): port flags, the port of an address
    flag, and the highest port SGLang derives from them (``derived_ports``)."""
    issues = []
    for spec in table.flags:
        value = values.get(spec.dest)
        flag = spec.options[0]
        if value is not None and is_address_flag(spec):
            port_text = address_port(str(value))
            number = _port_number(port_text)
            if number is None:
                # SGLang joins it into ``tcp://HOST:PORT`` and splits it at ":" for its ZMQ
                # ports: an address without a readable port fails only when the ranks start.
                text = f"{flag} {str(value)[:40]} is not HOST:PORT (a host and a TCP port)"
                issues.append(FlagIssue("invalid", flag, text))
            elif not 1 <= number <= 65535:
                text = f"{flag} {str(value)[:40]}: port {port_text} is not a TCP port (1–65535)"
                issues.append(FlagIssue("invalid", flag, text))
            continue
        if value is None or not is_port_flag(spec):
            continue
        for port in value if isinstance(value, list) else [value]:
            number = _port_number(port)
            if number is None or not 1 <= number <= 65535:
                text = f"{flag} {str(port)[:20]} is not a TCP port (1–65535)"
                issues.append(FlagIssue("invalid", flag, text))
                break
    derived = derived_ports(values)
    if not issues and derived is not None and derived[0] > 65535:
        top, how, flag = derived
        text = (
            f"with DP attention SGLang takes TCP ports up to {how} = {top}, beyond 65535: "
            f"choose a {flag} port at least {top - 65535} lower"
        )
        issues.append(FlagIssue("invalid", flag, text))
    return issues


def _abbreviated(named: set[str], parser: argparse.ArgumentParser) -> set[str]:
    """The dests of the options that ``named`` flags abbreviate (argparse takes a unique
    prefix of an option). Each distinct flag is looked up once."""
    options = parser._option_string_actions
    dests = set()
    for flag in named:
        if not flag.startswith("--") or flag in options:
            continue
        matches = [o for o in options if o.startswith(flag)]
        if len(matches) == 1:
            dests.add(options[matches[0]].dest)
    return dests


def _flag_in(message: str) -> str:
    for word in message.replace(":", " ").split():
        if word.startswith("--"):
            return word.rstrip(",")
    return ""
