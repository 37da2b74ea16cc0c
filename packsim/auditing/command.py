"""``packsim audit``: the contamination audit on the built-in tiny pipeline under each setup."""

from __future__ import annotations

from packsim.auditing.auditor import audit
from packsim.core.batch import PackedBatch


def add_arguments(parser) -> None:
    """``packsim audit`` options: which setups, the seed, and the size of the demo batch."""
    from packsim.core.setups import SETUPS

    parser.add_argument("--setups", default=",".join(SETUPS),
                        help=f"comma-separated presets to audit (default: {','.join(SETUPS)})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the examples and the model")
    parser.add_argument("--examples", type=int, default=6, help="number of examples in the batch")
    parser.add_argument("--capacity", type=int, default=64, help="tokens per packed row")


def run(args) -> int:
    """Audit the built-in tiny pipeline (make_examples + build_model) under each setup; print tables."""
    from packsim.core.data import make_examples
    from packsim.core.errors import PacksimError
    from packsim.core.model import build_model
    from packsim.core.setups import get_setup

    names = [s.strip() for s in args.setups.split(",") if s.strip()]
    if not names:
        raise PacksimError(f"--setups {args.setups!r} names no setup: e.g. --setups buggy,correct.")
    for flag, value in (("--examples", args.examples), ("--capacity", args.capacity)):
        if value < 1:
            raise PacksimError(f"{flag} {value}: must be at least 1.")
    setups = [get_setup(name) for name in names]  # unknown names raise before any work
    examples = make_examples(args.examples, seed=args.seed)
    model = build_model("tiny", seed=args.seed)
    summary = []
    for setup in setups:
        batch = PackedBatch.from_examples(examples, capacity=args.capacity, setup=setup)
        report = audit(model, batch, seed=args.seed)
        print(f"=== setup {setup.name!r}: {batch!r}")
        print(report.table())
        print()
        summary.append((setup.name, "PASS" if report.ok else "FAIL", ", ".join(report.failed) or "-",
                        f"{report.seconds:.2f}s"))
    width = max(len(s[0]) for s in summary)
    print("summary")
    for name, result, failed, secs in summary:
        print(f"  {name.ljust(width)}  {result}  {secs}  failed: {failed}")
    return 0
