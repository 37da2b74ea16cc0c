"""packsim's version: the installed distribution's (``pyproject.toml`` is its one source).

Lessons: none directly.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("packsim")
except PackageNotFoundError:  # a source tree on sys.path without `pip install -e .`
    __version__ = "0+unknown"
