"""The domain package must stay pure: no Django, Celery, paramiko, nor the rest of ``nodes``."""

from __future__ import annotations

import ast
from pathlib import Path

import nodes.domain

FORBIDDEN = ("django", "celery", "paramiko", "kombu", "redis", "pynvml", "controlpanel")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _violations(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            outside_domain = name.startswith("nodes.") and not name.startswith("nodes.domain")
            if top in FORBIDDEN or name == "nodes" or outside_domain:
                found.append(f"{path.name}: import {name}")
    return found


def test_domain_package_imports_nothing_forbidden():
    root = Path(nodes.domain.__file__).parent
    assert list(root.glob("*.py")), "the domain package has no modules to check"
    assert _violations(root) == []


def test_the_check_catches_a_forbidden_import(tmp_path):
    (tmp_path / "bad.py").write_text("from django.db import models\nimport nodes.models\n")
    assert _violations(tmp_path) == [
        "bad.py: import django.db",
        "bad.py: import nodes.models",
    ]
