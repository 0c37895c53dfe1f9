"""No import cycles among vidloom's modules (issue 34): a cycle held open by a function-local import is still one.

The graph is read from the source with `ast`: module-level and function-local imports both count, and
`from a import b` where `a.b` is a module imports `a.b`. Imports under `if TYPE_CHECKING:` never run, so
they are not edges. A cycle is a strongly connected component of more than one module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vidloom"

# Cycles still to break, each with its reason; the test fails on any other cycle, and on an entry here that
# no longer exists (so the list only shrinks).
KNOWN: dict[frozenset[str], str] = {
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """Every module `tree` imports, at any depth, except under `if TYPE_CHECKING:`."""
    found: set[str] = set()
    pending = [tree]
    while pending:
        node = pending.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                pending.extend(child.orelse)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                for alias in child.names:
                    sub = f"{child.module}.{alias.name}"
                    found.add(sub if sub in modules else child.module)
            pending.append(child)
    return found


def module_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    modules = set(paths)
    return {name: (_imported(ast.parse(path.read_text(), str(path)), modules) & modules) - {name}
            for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def _show(component: frozenset[str], graph: dict[str, set[str]]) -> str:
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & component))}" for m in sorted(component))


def test_no_import_cycles():
    graph = module_graph(PACKAGE)
    new = [c for c in cycles(graph) if c not in KNOWN]
    assert not new, "import cycles (move the shared piece where both sides can import it):\n" + \
        "\n\n".join(_show(c, graph) for c in new)


def test_the_known_list_only_shrinks():
    gone = [sorted(c) for c in set(KNOWN) - cycles(module_graph(PACKAGE))]
    assert not gone, f"broken, so drop them from KNOWN: {gone}"


@pytest.mark.parametrize("a_source, cyclic", [
    ("from pkg import b\n", True),  # pkg.b is a module: an edge to it
    ("def f():\n    import pkg.b\n", True),  # function-local imports count
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n", False),  # never runs
    ("from pkg import VALUE\n", False),  # a name of pkg/__init__.py, not the module b
])
def test_the_graph_sees_every_kind_of_import(tmp_path, a_source, cyclic):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("VALUE = 1\n")
    (root / "a.py").write_text(a_source)
    (root / "b.py").write_text("import pkg.a\n")
    assert cycles(module_graph(root)) == ({frozenset({"pkg.a", "pkg.b"})} if cyclic else set())
