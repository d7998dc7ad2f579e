"""The server's argument parser, rebuilt from SGLang's own flag table for the node's version.

``flags-by-version.tsv`` lists, per version, every option string with its dest, type, action,
default and choices, as dumped from ``ServerArgs.add_cli_args`` (shared/reference). Building an
``argparse`` parser from it gives SGLang's exact behaviour on bad input: the same wording, exit
code 2, and prefix abbreviations resolved (or ambiguous) as in the real version.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
from typing import Any

TABLE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "flags-by-version.tsv")
# The table has no nargs column; these take lists in every version that has them.
LIST_FLAGS = {"cuda_graph_bs", "cuda_graph_bs_decode", "cuda_graph_bs_prefill", "lora_paths"}


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3] if p.isdigit())


def human_readable_int(text: str) -> int:
    units = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * units[suffix])
    return int(text)


def loads(text: str) -> Any:
    return json.loads(text)


def json_list_type(text: str) -> Any:
    return json.loads(text)


def nullable_str(text: str) -> str | None:
    return None if text.lower() in ("none", "null", "") else text


_TYPES: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "loads": loads,
    "json_list_type": json_list_type,
    "human_readable_int": human_readable_int,
    "nullable_str": nullable_str,
}


def _default(text: str) -> Any:
    if text in ("", "None"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def rows(version: str) -> list[dict[str, str]]:
    found = []
    with open(TABLE) as handle:
        header: list[str] | None = None
        for line in handle:
            if line.startswith("#"):
                continue
            cells = line.rstrip("\n").split("\t")
            if header is None:
                header = cells
                continue
            row = dict(zip(header, cells, strict=False))
            if row["version"] == version:
                found.append(row)
    if not found:
        raise SystemExit(f"simfleet: no flag table for SGLang {version}")
    return found


def build_parser(version: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    for row in rows(version):
        options = row["options"].split("|")
        dest, action, kind = row["dest"], row["action"], row["type"]
        kwargs: dict[str, Any] = {"dest": dest, "default": _default(row["default"])}
        if action in ("_StoreTrueAction", "DeprecatedStoreTrueAction", "DeprecatedAction"):
            kwargs["action"] = "store_true"
        elif action == "DeprecatedStoreConstAction":
            kwargs["action"] = "store_const"
            kwargs["const"] = True
        elif action == "BooleanOptionalAction":
            kwargs["action"] = argparse.BooleanOptionalAction
            options = [o for o in options if not o.startswith("--no-")]
        else:
            kwargs["type"] = _TYPES.get(kind, str)
            if row.get("choices"):
                kwargs["choices"] = row["choices"].split(",")
                if kind == "int":
                    kwargs["choices"] = [int(c) for c in kwargs["choices"]]
            if dest in LIST_FLAGS or action == "LoRAPathAction":
                kwargs["nargs"] = "+"
        if dest == "model_path":
            kwargs["required"] = True
        parser.add_argument(*options, **kwargs)
    return parser


def parse(version: str, argv: list[str]) -> argparse.Namespace:
    """Parse like SGLang: argparse errors print usage and exit with status 2."""
    return build_parser(version).parse_args(argv)


def get(ns: argparse.Namespace, *names: str, default: Any = None) -> Any:
    """First attribute present among ``names`` (dests were renamed between versions)."""
    for name in names:
        if hasattr(ns, name):
            value = getattr(ns, name)
            return default if value is None else value
    return default
