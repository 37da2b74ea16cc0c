"""The widgets' front end as package data: HTML and CSS templates in ``packsim/viz/frontend/``.

Markup and CSS live in plain files next to the code (as bertviz keeps its front end), not in
Python f-strings; :func:`template` reads one as a :class:`string.Template` that the module using it
fills with ``$name`` placeholders (``substitute``), so CSS braces need no escaping. The values are
escaped by the caller (``html.escape`` stays in Python, next to the data). A file's final newline
is not part of the template: ``report.css`` ending in a newline renders without it.

The folder holds data only (no ``__init__.py``); ``[tool.setuptools.package-data]`` ships it.

Lessons: none directly (its templates show in 02, 06: leakage explorer; 06, 09, A5: report).
"""

from __future__ import annotations

import string
from functools import cache
from importlib.resources import files

__all__ = ["template"]


@cache
def template(name: str) -> string.Template:
    """``packsim/viz/frontend/<name>`` as a :class:`string.Template` (read once, then cached)."""
    text = (files("packsim.viz") / "frontend" / name).read_text(encoding="utf-8")
    return string.Template(text[:-1] if text.endswith("\n") else text)
