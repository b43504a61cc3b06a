"""Public names of a package imported from their modules on first use (PEP 562).

A package lists its public API as ``{name: "module"}``: the attribute ``name`` of ``package.module``,
or ``"module:attribute"`` when the public name differs from the attribute (which may also be a submodule,
as in ``from package.module import attribute``). :func:`lazy_exports` turns that table into the package's
``__getattr__``, ``__dir__`` and ``__all__``, so importing the package imports none of the modules; the
first use of a name imports its module, and the value is kept in the package for the next use.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str], eager: tuple[str, ...] = (), *,
                 modules_of: str | None = None) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` of ``package`` from its table of public names.

    Parameters
    ----------
    package
        The package's ``__name__``.
    exports
        Public name → ``"module"`` or ``"module:attribute"``, modules relative to ``package``.
    eager
        Public names the package defines itself (``__version__``).
    modules_of
        The package the table's modules are relative to, when it is not ``package`` itself (a module
        such as ``headprobe.frontend`` that exports names of its parent's modules).

    Returns
    -------
    getattr, dir, all
        ``__all__`` is every public name, sorted; ``dir()`` lists exactly those. Names that are not
        public but are submodules of ``package`` (``headprobe.paths``) still resolve, as they would
        after ``import package.submodule``.
    """
    public = sorted({*exports, *eager})
    base = modules_of or package

    def __getattr__(name: str) -> Any:
        target = exports.get(name)
        if target is None:
            if modules_of is None and not name.startswith("__") \
                    and importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, _, attribute = target.partition(":")
        module = importlib.import_module(f"{base}.{module_name}")
        attribute = attribute or name
        try:
            value = getattr(module, attribute)
        except AttributeError:
            value = importlib.import_module(f"{module.__name__}.{attribute}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return list(public)

    return __getattr__, __dir__, list(public)
