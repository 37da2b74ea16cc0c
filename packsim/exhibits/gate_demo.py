"""The demo of ``packsim audit`` without ``--model`` or ``--trainer``: the built-in tiny pipeline
(:func:`~packsim.core.data.make_examples` + :func:`~packsim.core.model.build_model`) packed under each
setup of ``--setups``, audited by :func:`packsim.audit`, each report and a summary printed; exit 0.

Its options (``--setups``, ``--examples``, ``--capacity``, ``--seed``) are the gate's
(:func:`packsim.auditing.command.add_arguments`); :mod:`packsim.commands.audit` hands it to the gate's
``run``, which keeps the deadline and Ctrl-C handling around it.

Lessons: none directly.
"""

from __future__ import annotations

from packsim.auditing.auditor import audit
from packsim.core.batch import PackedBatch
from packsim.core.data import make_examples
from packsim.core.errors import PacksimError
from packsim.core.model import build_model
from packsim.core.option_checks import check_at_least
from packsim.core.setups import get_setup

__all__ = ["run_demo"]


def run_demo(args) -> int:
    """Audit the built-in tiny pipeline (make_examples + build_model) under each setup; print tables."""
    names = [s.strip() for s in args.setups.split(",") if s.strip()]
    if not names:
        raise PacksimError(f"--setups {args.setups!r} names no setup: e.g. --setups buggy,correct.")
    check_at_least(args, {"--examples": 1, "--capacity": 1})
    setups = [get_setup(name) for name in names]  # unknown names raise before any work
    examples = make_examples(args.examples, seed=args.seed)
    model = build_model("tiny", seed=args.seed)
    summary = []
    for setup in setups:
        batch = PackedBatch.from_examples(examples, capacity=args.capacity, setup=setup)
        report = audit(model, batch, seed=args.seed)
        print(f"=== setup {setup.name!r}: {batch!r}")
        print(report.console())
        print()
        summary.append((setup.name, report.status.upper(), ", ".join(report.failed) or "-",
                        f"{report.seconds:.2f}s"))
    width = max(len(s[0]) for s in summary)
    print("summary")
    for name, result, failed, secs in summary:
        print(f"  {name.ljust(width)}  {result}  {secs}  failed: {failed}")
    return 0
