"""The data designs: what the experiment's commands train on, by the name their ``--data`` option takes.

- :data:`COMPARE_DESIGNS`, ``packsim compare --data`` (:mod:`packsim.experiment.comparison`):
  ``tasks`` (the course's task suites) or ``facts`` (facts recalled from memory, the design where
  the loss curve lies: :mod:`packsim.experiment.paraphrased_facts`);
- :data:`TRAIN_DESIGNS`, ``packsim train --data`` (lesson 10): ``tasks`` (the course's mix) or
  ``long_tailed`` (copy examples whose response counts differ a lot, so data-parallel ranks hold
  unequal counts); :func:`make_data` builds either stream.

Importing this module loads neither torch nor numpy (the command lines read the names for their
options before any run); :func:`make_data` imports the generators when it is called.

Lessons: 10.
"""

from __future__ import annotations

from packsim.core.errors import PacksimError

__all__ = ["COMPARE_DESIGNS", "TRAIN_DESIGNS", "make_data"]

COMPARE_DESIGNS = ("tasks", "facts")  # packsim compare --data
TRAIN_DESIGNS = ("tasks", "long_tailed")  # packsim train --data


def make_data(kind: str, n: int, seed: int, capacity: int) -> list:
    """``n`` examples of the ``packsim train`` design ``kind``: ``tasks`` (the course's mix) or
    ``long_tailed`` copy examples (lengths up to ``capacity``; response counts differ a lot between
    examples, so ranks get unequal counts).

    Example::

        >>> from packsim import make_data
        >>> [len(ex.tokens) for ex in make_data("tasks", 3, seed=0, capacity=256)]
        [21, 14, 21]
        >>> [len(ex.tokens) for ex in make_data("long_tailed", 3, seed=0, capacity=256)]
        [72, 57, 114]
    """
    from packsim.core.data import make_examples, make_long_tailed_examples

    if kind == "tasks":
        return make_examples(n, seed=seed)
    if kind == "long_tailed":
        return make_long_tailed_examples(n, seed=seed, median=max(8, min(90, capacity // 4)), max_len=capacity)
    raise PacksimError(f"unknown --data {kind!r}: use one of {list(TRAIN_DESIGNS)}.")
