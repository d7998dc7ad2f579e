"""Run on a node as ``python3 - MODEL_DIR [STAMP]`` with this file on stdin: reads the model
folder's ``config.json`` and the JSON header of every ``*.safetensors`` file (the first 8 bytes
give the header's length; the tensors themselves are never read), and prints one JSON document:

``{"config": {...}, "weights_bytes": N, "stamp": "SIZE:MTIME_NS", "tensors": [[pattern, dtype,
shape, count], ...]}``: tensors are grouped by their name with layer and expert numbers replaced
by ``*`` (Kimi-K2 has about 200,000 tensors; a few hundred groups say the same). When ``STAMP``
equals the folder's stamp (total size and newest mtime of its files), only
``{"unchanged": true, "stamp": ...}`` is printed: the panel keeps what it read before.
``{"problem": WORD}`` says what could not be read (``no-folder``, ``no-config``, ``denied``,
``bad-config``, ``unreadable``). Stdlib only (Python 3.7+).
"""

from __future__ import annotations

import json
import os
import re
import struct
import sys

HEADER_MAX = 200 * 1024 * 1024  # safetensors' own limit is 100 MB
NUMBERS = re.compile(r"\.(layers|h|blocks|experts)\.\d+\.")


def stamp(path: str, names: list[str]) -> str:
    size, newest = 0, 0
    for name in names:
        info = os.stat(os.path.join(path, name))
        size += info.st_size
        newest = max(newest, info.st_mtime_ns)
    return f"{size}:{newest}"


def header(file: str) -> dict[str, object]:
    with open(file, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if length > HEADER_MAX:
            raise ValueError(f"header of {length} bytes")
        doc = json.loads(handle.read(length))
    if not isinstance(doc, dict):
        raise ValueError("header is not a JSON object")
    return doc


CONFIG_MAX = 4 * 1024 * 1024  # a config.json larger than this is no model's


def main() -> None:
    path = sys.argv[1]
    known = sys.argv[2] if len(sys.argv) > 2 else ""
    # A problem is answered as a word the panel turns into a sentence: no traceback, and no
    # exception text about the node's files, leaves the node.
    if not os.path.isdir(path):
        print(json.dumps({"problem": "no-folder"}))
        return
    try:
        with open(os.path.join(path, "config.json"), "rb") as handle:
            config = json.loads(handle.read(CONFIG_MAX).decode("utf-8"))
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        print(json.dumps({"problem": "no-config"}))
        return
    except PermissionError:
        print(json.dumps({"problem": "denied"}))
        return
    except (ValueError, UnicodeDecodeError, RecursionError):
        print(json.dumps({"problem": "bad-config"}))
        return
    except OSError:
        print(json.dumps({"problem": "unreadable"}))
        return
    if not isinstance(config, dict):
        print(json.dumps({"problem": "bad-config"}))
        return
    weights = [n for n in names if n.endswith((".safetensors", ".bin", ".pt"))]
    now = stamp(path, weights + ["config.json"])
    if known and known == now:
        print(json.dumps({"unchanged": True, "stamp": now}))
        return
    total = sum(os.path.getsize(os.path.join(path, n)) for n in weights)
    groups: dict[tuple[str, str, str], int] = {}
    problem = None
    for name in weights:
        if not name.endswith(".safetensors"):
            problem = f"{name} is not safetensors"
            continue
        try:
            doc = header(os.path.join(path, name))
        except (OSError, ValueError) as exc:
            problem = f"{name}: {exc}"
            continue
        for tensor, info in doc.items():
            if tensor == "__metadata__" or not isinstance(info, dict):
                continue
            key = (
                NUMBERS.sub(lambda m: f".{m.group(1)}.*.", tensor),
                str(info.get("dtype")),
                json.dumps(info.get("shape")),
            )
            groups[key] = groups.get(key, 0) + 1
    out: dict[str, object] = {"config": config, "weights_bytes": total, "stamp": now}
    if problem is None and groups:
        out["tensors"] = [[p, d, json.loads(s), c] for (p, d, s), c in sorted(groups.items())]
    else:
        out["headers_error"] = problem or "no safetensors files"
    print(json.dumps(out, separators=(",", ":")))


if __name__ == "__main__":
    main()
