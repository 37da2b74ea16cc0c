"""``packsim audit``: the pre-flight gate (:mod:`packsim.auditing.command`: its options, exit codes,
deadline and Ctrl-C handling) and, without ``--model`` or ``--trainer``, the demo
(:mod:`packsim.exhibits.gate_demo`), which the gate's own room (auditing) cannot import.

Lessons: none directly.
"""

from __future__ import annotations

from packsim.auditing.command import EXIT_CODES, add_arguments
from packsim.auditing.command import run as run_gate

__all__ = ["EXIT_CODES", "add_arguments", "run"]


def run(args) -> int:
    """The gate, or the demo when no pipeline is named (imported only then: the gate loads what its verdict needs)."""
    def demo(demo_args) -> int:
        from packsim.exhibits.gate_demo import run_demo

        return run_demo(demo_args)

    return run_gate(args, demo=demo)
