"""Which install extra a part of packsim needs, and the one-line error when it is missing.

``pip install packsim`` is the library, the audit and the CLI on torch, transformers, tokenizers,
numpy, numba, tqdm and accelerate. Two extras add the rest (pyproject.toml):

- ``course``: what the notebooks need (jupyterlab, ipykernel, ipywidgets, plotly, pyyaml,
  nbconvert, and TRL, whose collators lessons 07 and A6 build); :mod:`packsim.viz` asks for it;
- ``trl``: TRL alone, for ``packsim audit --collator trl-*`` and ``SFTTrainer`` pipelines.

:func:`require` checks the import names with ``importlib.util.find_spec`` (nothing is imported)
and raises one :class:`PacksimError` line naming the extra, e.g.
``packsim.viz.leakage_explorer needs the course extra (plotly, ipywidgets are not installed
here): pip install "packsim[course]"``.

Lessons: none directly.
"""

from __future__ import annotations

import importlib.util
import sys

from packsim.core.errors import PacksimError

__all__ = ["EXTRAS", "missing", "require"]

# extra -> how the message names what it brings
EXTRAS = {"course": "the course extra", "trl": "TRL"}


def missing(*modules: str) -> list[str]:
    """The import names among ``modules`` that cannot be imported here (in the order given)."""
    gone = []
    for name in modules:
        if name in sys.modules and sys.modules[name] is None:  # blocked, as tests do
            gone.append(name)
            continue
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder that refuses the name, a module without spec
            found = False
        if not found:
            gone.append(name)
    return gone


def require(what: str, extra: str, *modules: str) -> None:
    """Raise a one-line :class:`PacksimError` when any of ``modules`` is missing: ``what`` needs ``extra``."""
    if extra not in EXTRAS:
        raise PacksimError(f"unknown extra {extra!r}: use one of {', '.join(EXTRAS)}.")
    gone = missing(*modules)
    if not gone:
        return
    verb = "is" if len(gone) == 1 else "are"
    raise PacksimError(f"{what} needs {EXTRAS[extra]} ({', '.join(gone)} {verb} not installed here): "
                       f'pip install "packsim[{extra}]"')
