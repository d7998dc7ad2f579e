"""simfleet and the product stay apart: simfleet's SGLang arithmetic is written independently of
Rankwise's (so end-to-end tests can catch the product's mistakes), and the product never knows
it is talking to a simulated node."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(folder: Path) -> set[tuple[str, str]]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {(str(path.relative_to(ROOT)), a.name.split(".")[0]) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add((str(path.relative_to(ROOT)), node.module.split(".")[0]))
    return found


def test_simfleet_does_not_import_the_product():
    imports = _imports(ROOT / "simfleet")
    assert imports, "no imports found: the scan is broken"
    assert {(f, m) for f, m in imports if m in {"nodes", "controlpanel", "django"}} == set()


def test_the_product_does_not_import_simfleet():
    for package in ("nodes", "controlpanel"):
        assert {
            (f, m) for f, m in _imports(ROOT / package) if m in {"simfleet", "simnode"}
        } == set()
