"""No import cycle among the modules of ``nodes``, anywhere (the acceptance of the redesign).

The graph is read from the source (AST), so an import inside a function counts like one at the
top of a module: it still makes the two modules depend on each other. An edge goes to the module
an import names: ``from a.b import c`` is an edge to ``a.b.c`` when ``c`` is a module, else to
``a.b`` (a name it defines). The packages an import passes through on the way (``a`` and ``a.b``
for ``import a.b.c``) are not edges: that a package's ``__init__`` re-exports its submodules is
not a cycle of theirs. Cycles are the strongly connected components of that graph (Tarjan).

``SCOPE`` is the part of ``nodes`` that must be free of cycles; the graph is always built for
the whole package, so widening it is changing ``SCOPE``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import nodes

SCOPE = "nodes"


def module_names(root: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: path}`` for every ``.py`` file under ``root`` (the package
    ``package``); a package's ``__init__.py`` is the package's own name."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names one import statement of ``module`` asks for."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        # A package's own relative imports start at the package; a module's at its parent.
        anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
        base = ".".join([*anchor, base] if base else anchor)
    for alias in node.names:
        yield f"{base}.{alias.name}"
        yield base


def import_graph(names: Mapping[str, Path]) -> dict[str, set[str]]:
    """``{module: the modules of names it imports}``, imports inside functions included."""
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets = list(_imported(node, module, is_package))
            if isinstance(node, ast.ImportFrom):
                # ``from a import b``: the module ``a.b`` if there is one, else ``a`` itself.
                pairs = zip(targets[::2], targets[1::2], strict=True)
                targets = [sub if sub in names else base for sub, base in pairs]
            edges.update(t for t in targets if t in names and t != module)
        graph[module] = edges
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted, in order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _in_scope(component: list[str], scope: str) -> bool:
    return any(m == scope or m.startswith(scope + ".") for m in component)


def test_no_import_cycle_in_scope():
    root = Path(nodes.__file__).parent
    graph = import_graph(module_names(root, "nodes"))
    assert any(m.startswith(SCOPE + ".") for m in graph), f"no module of {SCOPE} was read"
    assert [c for c in cycles(graph) if _in_scope(c, SCOPE)] == []


def test_the_check_finds_a_cycle_through_an_import_inside_a_function(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.sub.a import run\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from pkg.sub import b\n\ndef run():\n    pass\n")
    (package / "sub" / "b.py").write_text("def later():\n    from .c import x\n")
    (package / "sub" / "c.py").write_text("import pkg.sub.a\nx = 1\n")
    (package / "lone.py").write_text("from pkg import sub\nfrom . import lone\n")
    graph = import_graph(module_names(package, "pkg"))
    assert graph["pkg.sub.b"] == {"pkg.sub.c"}
    assert graph["pkg"] == {"pkg.sub.a"}
    assert graph["pkg.lone"] == {"pkg.sub"}
    assert cycles(graph) == [["pkg.sub.a", "pkg.sub.b", "pkg.sub.c"]]
    assert _in_scope(cycles(graph)[0], "pkg.sub") and not _in_scope(cycles(graph)[0], "pkg.su")
