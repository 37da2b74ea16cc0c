"""Fast or full mode: the budget every run of the experiment and every lesson uses.

``PACKSIM_FAST=1`` (CI, a workshop's quick pass) shrinks each training run, evaluation and
benchmark; unset, the runs are the full ones the committed results come from.

Lessons: 00, 01, 02, 05, 06, 07, 08, 09, 10, A1, A2, A3, A4, A5, A6, A7.
"""

from __future__ import annotations

import os

__all__ = ["fast_mode"]


def fast_mode() -> bool:
    """True when ``PACKSIM_FAST`` is set to a truthy value (CI and quick notebook runs).

    Example::

        >>> import packsim
        >>> from unittest import mock
        >>> with mock.patch.dict("os.environ", {"PACKSIM_FAST": "1"}):
        ...     print(packsim.fast_mode())
        True
    """
    return os.environ.get("PACKSIM_FAST", "").strip().lower() not in ("", "0", "false", "no")
