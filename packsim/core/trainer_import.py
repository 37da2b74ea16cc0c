"""transformers' ``Trainer`` imported without ``datasets`` (pyarrow, pandas) when nothing needs it.

``transformers/trainer.py`` imports ``datasets`` whenever it is installed (``if
is_datasets_available(): import datasets``, at module import), and reads it only as
``isinstance(x, datasets.Dataset)`` (to drop unused columns, infer lengths) and
``datasets.__version__`` (reached only for such a dataset). The gate's own Trainers
(``--collator packsim`` / ``flattening``) take a plain list of features, and a factory's
(``--trainer``) may too: ``datasets`` there is hundreds of modules and a good share of the gate's
time to verdict for nothing (tests/test_gate_imports.py holds that the gate does not import it;
benchmarks/gate_time.py times it).

:func:`import_trainer` imports ``transformers.trainer`` with a stand-in bound as its ``datasets``:

- once the real ``datasets`` is imported (by anyone, before or after), every attribute is the
  real module's, so a ``datasets.Dataset`` is recognised exactly as before;
- until then ``Dataset`` is a class nothing is an instance of, which is the truth: no object
  of ``datasets.Dataset`` exists while its module is not loaded; any other name imports the
  real module and is its.

The stand-in sits in ``sys.modules`` only while ``transformers.trainer`` is imported (a later
``import datasets`` loads the real package); ``is_datasets_available()`` keeps its answer. Where
``datasets`` or ``transformers.trainer`` is already imported, nothing is changed.
No tensors.

Lessons: none directly (``packsim audit``: :mod:`packsim.auditing.preflight`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

__all__ = ["import_trainer"]


class _NoDataset:
    """What ``datasets.Dataset`` is before ``datasets`` is imported: nothing is an instance of it."""


class _DatasetsStandIn(types.ModuleType):
    """``datasets`` for ``transformers.trainer``: the real module once loaded, ``_NoDataset`` until then."""

    def __init__(self, spec):
        super().__init__("datasets")
        self.__spec__ = spec  # importlib.util.find_spec("datasets") reads it while this is in sys.modules
        self._imported = False  # True once transformers.trainer is imported (the stand-in left sys.modules)

    def __getattr__(self, name: str):
        real = sys.modules.get("datasets")
        if real is None or real is self:
            if name.startswith("__") and name != "__path__":  # inspect.getmodule probes __file__ of sys.modules
                raise AttributeError(name)
            if name == "Dataset" and self._imported:
                return _NoDataset
            if sys.modules.get("datasets") is self:  # someone needs datasets itself: load it for real
                del sys.modules["datasets"]
            real = importlib.import_module("datasets")
        return getattr(real, name)


def import_trainer():
    """``transformers.trainer``, imported without ``datasets`` unless it is already loaded (module doc)."""
    if "transformers.trainer" in sys.modules or "datasets" in sys.modules:
        return importlib.import_module("transformers.trainer")
    spec = importlib.util.find_spec("datasets")
    if spec is None:  # not installed: transformers imports nothing either
        return importlib.import_module("transformers.trainer")
    stand_in = _DatasetsStandIn(spec)
    sys.modules["datasets"] = stand_in
    try:
        return importlib.import_module("transformers.trainer")
    finally:
        if sys.modules.get("datasets") is stand_in:
            del sys.modules["datasets"]
        stand_in._imported = True
