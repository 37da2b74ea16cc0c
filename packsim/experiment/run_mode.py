"""Fast or full mode: the budget every run of the experiment and every lesson uses; the data designs.

``PACKSIM_FAST=1`` (CI, a workshop's quick pass) shrinks each training run, evaluation and
benchmark; unset, the runs are the full ones the committed results come from. :data:`DESIGNS`
names the comparison's data designs (:mod:`packsim.experiment.comparison`), here so that the
``packsim compare`` options need no torch.

Lessons: 00, 01, 02, 05, 06, 07, 08, 09, 10, A1, A2, A3, A4, A5, A6, A7.
"""

from __future__ import annotations

import os

__all__ = ["DESIGNS", "fast_mode"]

DESIGNS = ("tasks", "facts")  # the comparison's data: task suites, or facts recalled from memory


def fast_mode() -> bool:
    """True when ``PACKSIM_FAST`` is set to a truthy value (CI and quick notebook runs)."""
    return os.environ.get("PACKSIM_FAST", "").strip().lower() not in ("", "0", "false", "no")
