"""No two modules of headprobe import each other, directly or around a loop (the runtime, and the whole package).

Every import counts: module-level ones, those inside functions (a function-level import is still a
dependency, only a later one) and those under ``if TYPE_CHECKING:`` (a dependency of the annotations).
An import of a package counts as an import of its ``__init__``; the parent packages Python imports on the
way are not edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

import headprobe


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, type_checking: bool) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, those under ``if TYPE_CHECKING:`` only with ``type_checking``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(package_dir: Path, type_checking: bool = True) -> dict[str, set[str]]:
    """Module → the modules of the same package it imports (by dotted name)."""
    root = package_dir
    files = {_module_name(root, p): p for p in sorted(package_dir.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8")), type_checking):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                           for alias in node.names]
            edges.update(t for t in targets if t in files and t != name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}          # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (loop := visit(nxt)):
                return loop
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (loop := visit(start)):
            return loop
    return None


#: The kernel dispatch names the store in its annotations (under ``TYPE_CHECKING``) while the store calls
#: the dispatch to gather a selection; the one loop left, outside the policy/cache/budget layers.
ANNOTATION_LOOPS: set[tuple[str, str]] = set()


def test_runtime_has_no_import_cycle():
    runtime = Path(headprobe.__file__).parent / "runtime"
    graph = import_graph(runtime, type_checking=False)
    assert "runtime.cache" in graph and "runtime.store" in graph["runtime.policies.base"]   # the walk sees the package
    loop = find_cycle(graph)
    assert loop is None, "import cycle: " + " -> ".join(loop)


def test_runtime_annotations_add_no_import_cycle():
    graph = import_graph(Path(headprobe.__file__).parent / "runtime")
    for src, dst in ANNOTATION_LOOPS:
        graph[src].discard(dst)
    loop = find_cycle(graph)
    assert loop is None, "import cycle (annotations included): " + " -> ".join(loop)


def test_headprobe_has_no_import_cycle():
    """The whole package, annotations included: a module that a mode, a policy or a stage needs sits below
    every module that needs it (e.g. the needle probe's settings in ``probes/probe_config.py``, which the
    fast, reference and reuse modes and the dispatcher all read)."""
    package = Path(headprobe.__file__).parent
    for type_checking in (False, True):
        graph = import_graph(package, type_checking=type_checking)
        assert "headprobe.probes.fast_mode" in graph and "headprobe.probes.probe_config" in \
            graph["headprobe.probes.fast_mode"] | graph["headprobe.probes.needle_probe"]
        loop = find_cycle(graph)
        assert loop is None, "import cycle: " + " -> ".join(loop)


def test_the_walk_finds_loops_through_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    assert find_cycle(import_graph(pkg, type_checking=False)) is None     # the TYPE_CHECKING import never runs
    assert find_cycle(import_graph(pkg)) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("import pkg.a\n")
    assert find_cycle(import_graph(pkg)) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]


def unexplained_local_imports(package_dir: Path) -> list[str]:
    """``file:line`` of every import inside a function that does not say why it is not at the top: no
    comment on its line or on the comment/import lines right above it (one comment covers a group), and
    no enclosing ``try`` that handles its absence."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines, tree = text.splitlines(), ast.parse(text)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                row = node.lineno - 1
                said = "#" in lines[row]
                while not said and row > 0 and lines[row - 1].strip().startswith(("#", "from ", "import ")):
                    row -= 1
                    said = "#" in lines[row]
                up = parents[node]
                while not said and up is not fn:
                    said = isinstance(up, ast.Try) and any(h.type is not None for h in up.handlers)
                    up = parents[up]
                if not said:
                    found.append(f"{path.relative_to(package_dir.parent)}:{node.lineno}")
    return list(dict.fromkeys(found))      # a nested function's import is walked twice


def test_every_function_level_import_says_why_it_is_not_at_the_top():
    """A plain import wherever import time allows; the rest keep a heavy or optional package (torch,
    transformers, Triton, matplotlib, an extra) out of modules that commands import without it."""
    assert unexplained_local_imports(Path(headprobe.__file__).parent) == []


def test_the_local_import_check_finds_an_unexplained_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "def f():\n    import json\n\n"
        "def g():\n    # numpy only when g runs\n    import numpy\n    from numpy import linalg\n\n"
        "def h():\n    try:\n        import yaml\n    except ImportError:\n        return None\n\n"
        "def k():\n    x = 1  # a comment above, but not on the import\n    import os\n")
    assert unexplained_local_imports(pkg) == ["pkg/a.py:2", "pkg/a.py:17"]
