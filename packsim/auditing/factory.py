"""The user's own trainer for ``packsim audit --trainer path/to/train.py:make_trainer``.

``load_trainer(spec)`` imports the factory named by ``spec`` and calls it with no arguments; the
Trainer / SFTTrainer it returns is audited as it is, with the user's config (batch size, max
length, bf16, gradient accumulation), collator, dtype and attention implementation (``packsim audit``
calls it inside :func:`packsim.reference.flash_emulation.reference_for_flash_requests`: a model it loads
with ``flash_attention_2`` where flash-attn cannot run gets transformers' flash path on the reference
kernel, and the report names it). ``spec`` is

- ``FILE.py:FUNC``: a Python file, imported under a private module name with its directory first
  on ``sys.path`` (so it can import its neighbours); keep the training itself under
  ``if __name__ == "__main__":`` so importing the file builds nothing but functions;
- ``package.module:FUNC``: a module importable from the current directory or the environment.

Anything that goes wrong before a trainer is in hand (no such file, an import that fails, a missing
or non-callable name, a factory that raises, calls ``sys.exit`` (any code, at import or when called)
or returns something else) is a
:class:`~packsim.core.errors.PacksimError` naming it: ``packsim audit`` exits 2 with one line. A
factory whose ``parallelism_config`` accelerate refuses where the gate runs (one plain process, or
CPU processes for context parallelism) gets the fix for that: the run's launcher, or its GPUs.

Lessons: none directly.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from packsim.core.errors import PacksimError
from packsim.core.upstream.accelerate_cp import build_refusal

__all__ = ["load_factory", "load_trainer"]

_USAGE = "pass --trainer path/to/train.py:make_trainer or --trainer package.module:make_trainer"
_BUILD = "it must build the trainer, called with no arguments."
# a ParallelismConfig refusing the place the gate runs in (packsim.core.upstream.accelerate_cp.build_refusal)
_REFUSED = {
    "launcher": ("its TrainingArguments' parallelism_config builds a device mesh, which needs the launcher's "
                 "environment: run the gate as the run starts, e.g. `torchrun --nproc_per_node N -m packsim audit "
                 "--trainer {spec}` (N: the config's total size)."),
    "device": ("accelerate builds a Trainer with a parallelism_config (context parallelism) only on GPUs, not "
               "in CPU processes: run the gate on the GPUs the run trains on, under its launcher; a packed row "
               "trains causal across its documents there (docs/audit.md, 'A Trainer trained context-parallel')."),
}


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"


def _exited(what, err: SystemExit) -> PacksimError:
    return PacksimError(f"--trainer: importing {what} called sys.exit({err.code!r}): keep argument parsing and "
                        "training under `if __name__ == \"__main__\":`, so importing it builds only functions.")


def _import_file(path: Path):
    if not path.is_file():
        raise PacksimError(f"--trainer {path}: no such file: {_USAGE}.")
    name = f"packsim_user_trainer_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PacksimError(f"--trainer {path}: not a Python file Python can import: {_USAGE}.")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as err:  # e.g. argparse at import time: the gate's exit table, not the file's code
        sys.modules.pop(name, None)
        raise _exited(path, err) from None
    except Exception as err:  # noqa: BLE001 -- the user's code: any failure is a setup error
        sys.modules.pop(name, None)
        raise PacksimError(f"--trainer: importing {path} raised {_first_line(err)}: fix the file so "
                           f"`python -c 'import runpy; runpy.run_path(\"{path}\")'` runs.") from None
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def _import_module(name: str):
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # as `python -m` does: the current directory's modules
    try:
        return importlib.import_module(name)
    except SystemExit as err:
        raise _exited(f"module {name!r}", err) from None
    except Exception as err:  # noqa: BLE001
        raise PacksimError(f"--trainer: importing module {name!r} raised {_first_line(err)}: {_USAGE}.") from None


def load_factory(spec: str):
    """The function ``spec`` (``FILE.py:FUNC`` or ``module:FUNC``) names; PacksimError if there is none."""
    where, sep, func = str(spec).rpartition(":")
    if not sep or not where or not func.isidentifier():
        raise PacksimError(f"--trainer {spec!r} names no function: {_USAGE}.")
    is_file = where.endswith(".py") or "/" in where or "\\" in where
    module = _import_file(Path(where)) if is_file else _import_module(where)
    factory = getattr(module, func, None)
    if factory is None:
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise PacksimError(f"--trainer {spec}: {where} defines no {func!r} (its functions: "
                           f"{', '.join(names) or 'none'}).")
    if not callable(factory):
        raise PacksimError(f"--trainer {spec}: {func} is a {type(factory).__name__}, not a function returning "
                           "a trainer.")
    return factory


def load_trainer(spec: str):
    """Call the factory ``spec`` names (no arguments) and return its transformers Trainer / TRL SFTTrainer."""
    factory = load_factory(spec)
    try:
        trainer = factory()
    except SystemExit as err:  # sys.exit(0) would read as a pass, sys.exit(7) as no code the gate has
        raise PacksimError(f"the trainer factory {spec} called sys.exit({err.code!r}) instead of returning a "
                           "Trainer: return the trainer, and keep sys.exit and trainer.train() under "
                           "`if __name__ == \"__main__\":`.") from None
    except Exception as err:  # noqa: BLE001
        raise PacksimError(f"--trainer {spec}: the factory raised {_first_line(err)}: "
                           f"{_REFUSED.get(build_refusal(err), _BUILD).format(spec=spec)}") from None
    if not (hasattr(trainer, "get_train_dataloader") and hasattr(trainer, "model")):
        raise PacksimError(f"--trainer {spec} returned {type(trainer).__name__} {str(trainer)[:40]!r}, not a "
                           "transformers Trainer or trl.SFTTrainer: return the trainer you call .train() on.")
    return trainer
