"""The one exception type packsim raises for bad input.

Every message says what was wrong and how to fix it. It subclasses ``ValueError`` so code that
already catches ``ValueError`` keeps working.

Lessons: none directly.
"""

from __future__ import annotations

__all__ = ["PacksimError"]


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
