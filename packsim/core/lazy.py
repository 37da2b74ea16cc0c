"""Lazy public names for a package (PEP 562): each name loads its module on first access.

``packsim``, ``packsim.auditing`` and ``packsim.viz`` map each public name to the module that
defines it, so importing the package loads none of them (``import packsim`` loads only itself,
``packsim.core``, this module and ``packsim.core.version``).

Lessons: none directly.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: dict[str, str], namespace: dict,
               subpackages: tuple[str, ...] = ()) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for a package whose public name ``n`` lives in ``homes[n]``.

    A loaded name is stored in ``namespace`` (the package's globals), so later lookups are plain
    attribute reads; a name in ``subpackages`` imports ``package.name``.
    """

    def __getattr__(name: str):
        if name in homes:
            value = getattr(importlib.import_module(homes[name]), name)
            namespace[name] = value
            return value
        if name in subpackages:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
