"""The command line imports each library name plainly from the module that defines it (``from
headprobe.limits import check_count``), the module the tables of public names give (``headprobe._API`` and
``headprobe.frontend._FRONTEND``), under its public name: static tools (a dependency walk, a dead-code finder,
go-to-definition) follow it, and the command line still uses only the public API and the front-end helpers.
No name is reached as an attribute of the lazily-filled modules (``headprobe.X``, ``hp.X``,
``frontend.X``)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import headprobe
import headprobe.frontend

ROOT = Path(__file__).resolve().parents[2]
CLI_FILES = sorted((ROOT / "cli" / "headprobe_cli").glob("*.py"))

#: Attributes of the package itself the command line may read: its version and where it is installed.
PACKAGE_ATTRIBUTES = ("__version__", "__file__")
#: Names the lazily-filled modules are bound to, in the command line or in a wrapper like it.
LAZY_MODULES = ("headprobe", "hp", "frontend")


def _targets(namespace) -> dict[str, tuple[object, str]]:
    """Public name → (``namespace``, ``"module"`` or ``"module:attribute"``) of one table."""
    table = headprobe._API if namespace is headprobe else headprobe.frontend._FRONTEND
    return {name: (namespace, target) for group in table.values() for name, target in group.items()}


#: Every public name: the namespace that exports it and where it comes from.
PUBLIC = {**_targets(headprobe), **_targets(headprobe.frontend)}


def _public_name(module: str, name: str, asname: str | None) -> str | None:
    """The public name ``from module import name [as asname]`` imports, if it is one the tables list with
    ``module`` as the module that defines it."""
    bound = asname or name
    entry = PUBLIC.get(bound)
    if entry is None:
        return None
    target_module, _, attribute = entry[1].partition(":")
    if module != f"headprobe.{target_module}" or name != (attribute or bound):
        return None
    return bound


def _imported(module: str, name: str):
    """The object ``from module import name`` binds (an attribute, or a submodule of that name)."""
    value = getattr(importlib.import_module(module), name, None)
    return value if value is not None else importlib.import_module(f"{module}.{name}")


def _spelled(module: str | None, name: str, asname: str | None) -> str:
    statement = f"from {module} import {name}" if module else f"import {name}"
    return statement + (f" as {asname}" if asname else "")


def check_source(source: str) -> tuple[list[str], set[str]]:
    """``(problems, public names imported)`` of one command-line module's source."""
    problems: list[str] = []
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "headprobe" and (alias.name != "headprobe" or alias.asname):
                    problems.append(f"line {line}: {_spelled(None, alias.name, alias.asname)}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "headprobe":
            for alias in node.names:
                if node.module == "headprobe" and alias.name == "__version__" and not alias.asname:
                    continue
                public = _public_name(node.module, alias.name, alias.asname)
                if public is None:
                    problems.append(f"line {line}: {_spelled(node.module, alias.name, alias.asname)}: not a "
                                    "public name of headprobe or headprobe.frontend imported from the module "
                                    "that defines it, under its public name")
                    continue
                namespace = PUBLIC[public][0]
                if _imported(node.module, alias.name) is not getattr(namespace, public):
                    problems.append(f"line {line}: {node.module}.{alias.name} is not "
                                    f"{namespace.__name__}.{public}")
                names.add(public)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in LAZY_MODULES \
                and not (node.value.id == "headprobe" and node.attr in PACKAGE_ATTRIBUTES):
            problems.append(f"line {line}: {node.value.id}.{node.attr}: import it from the module that "
                            "defines it")
    return problems, names


@pytest.mark.parametrize("path", CLI_FILES, ids=lambda p: p.name)
def test_each_name_is_imported_from_its_module_under_its_public_name(path):
    problems, _ = check_source(path.read_text())
    assert problems == [], f"{path.name}: " + "; ".join(problems)


def test_every_frontend_name_is_one_the_command_line_needs():
    # the front-end module is the command line's boundary, not a second home for internals
    used = set().union(*(check_source(p.read_text())[1] for p in CLI_FILES))
    assert used & set(headprobe.frontend.__all__) == set(headprobe.frontend.__all__)


@pytest.mark.parametrize(("source", "problem"), [
    ("from headprobe import frontend\nfrontend.check_count('n', 1)", "from headprobe import frontend"),
    ("from headprobe import frontend\nfrontend.check_count('n', 1)", "frontend.check_count"),
    ("import headprobe\nheadprobe.load_haystack(None)", "headprobe.load_haystack"),
    ("import headprobe as hp\nhp.load_haystack(None)", "import headprobe as hp"),
    ("import headprobe as hp\nhp.load_haystack(None)", "hp.load_haystack"),
    ("def f():\n    return frontend.trial_grid.parse_depths([0])", "frontend.trial_grid"),
    ("from headprobe import load_haystack", "from headprobe import load_haystack"),
    ("import headprobe.limits", "import headprobe.limits"),
    # a name from a module that only re-exports it, a private name, a public name bound to another name
    ("from headprobe.haystack import load_haystack", "from headprobe.haystack import load_haystack"),
    ("from headprobe.limits import _count", "from headprobe.limits import _count"),
    ("from headprobe.limits import check_count as count", "check_count as count"),
])
def test_the_check_finds_what_it_forbids(source, problem):
    problems, _ = check_source(source)
    assert any(problem in p for p in problems), problems


def test_the_check_takes_what_it_allows():
    source = ("import headprobe\nfrom headprobe import __version__\n"
              "from headprobe.limits import check_count\nfrom headprobe.probes import trial_grid\n"
              "headprobe.__version__, headprobe.__file__\n"
              "def f():\n    from headprobe.runtime.policies import POLICIES\n    return POLICIES\n")
    assert check_source(source) == ([], {"check_count", "trial_grid", "POLICIES"})
