"""``packsim train``: one setup on one process, or data-parallel under torchrun. The options are
:mod:`packsim.scaling.train_options`' (no torch import, so ``--help`` answers at once), the run
:mod:`packsim.scaling.train_command`'s.

Lessons: none directly.
"""

from __future__ import annotations

from packsim.scaling.train_options import add_arguments

__all__ = ["add_arguments", "run"]


def run(args) -> int:
    from packsim.scaling.train_command import run as run_train

    return run_train(args)
