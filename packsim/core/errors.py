"""The one exception type packsim raises for bad input, and whose code raised an exception.

Every message says what was wrong and how to fix it. It subclasses ``ValueError`` so code that
already catches ``ValueError`` keeps working. :func:`raised_outside_packsim` tells an exception of
the user's pipeline (their model, collator or dataset, transformers, torch) from a bug of packsim's:
the audit turns the first into a verdict or one line and lets the second crash.

Lessons: none directly.
"""

from __future__ import annotations

import traceback
from pathlib import Path

__all__ = ["PacksimError", "raised_outside_packsim"]


def raised_outside_packsim(err: BaseException) -> bool:
    """Whether the innermost frame of ``err`` is outside packsim (the model, a collator, transformers,
    torch) or in a reference kernel standing in for a CUDA package: not a bug of packsim's own code."""
    frames = list(traceback.walk_tb(err.__traceback__))
    if not frames:
        return False
    path = Path(frames[-1][0].f_code.co_filename).resolve()
    package = Path(__file__).resolve().parents[1]  # packsim/
    return not path.is_relative_to(package) or path.is_relative_to(package / "reference")


class PacksimError(ValueError):
    """Bad input to packsim: the message names the problem and the fix.

    Example::

        >>> import packsim
        >>> try:
        ...     packsim.get_setup("no_such_setup")
        ... except packsim.PacksimError as err:
        ...     print(str(err).split(":")[0])
        unknown setup 'no_such_setup'
    """
