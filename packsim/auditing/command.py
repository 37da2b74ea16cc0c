"""``packsim audit``: the contamination audit on the built-in tiny pipeline under each setup.

With ``--model DIR --data FILE.jsonl --collator NAME [--attn IMPL] [--strict]`` it is a pre-flight
gate instead: it audits the pipeline that checkpoint, data and collator would train
(:mod:`packsim.auditing.preflight`), prints the report, and with ``--strict`` exits 1 when the
audit fails, so a CI job or a launch script can stop before training.

Lessons: none directly.
"""

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
    pre = parser.add_argument_group("pre-flight gate (a local checkpoint and your data)")
    pre.add_argument("--model", metavar="DIR", help="local from_pretrained directory (config, weights, tokenizer)")
    pre.add_argument("--data", metavar="FILE", help='JSON Lines, one {"prompt": ..., "completion": ...} per line')
    pre.add_argument("--collator", metavar="NAME",
                     help="packsim, flattening, trl-bfd, trl-wrapped or trl-padding-free")
    pre.add_argument("--attn", metavar="IMPL", help="attention implementation (default: sdpa); "
                     "eager, sdpa, flex_attention, flash_attention_2/3 where available")
    pre.add_argument("--strict", action="store_true", help="exit 1 when the audit fails")
    pre.add_argument("--batches", type=int, default=1, help="training batches to audit (default 1)")
    pre.add_argument("--batch-size", type=int, default=4, help="per-device batch size (default 4)")
    pre.add_argument("--max-length", type=int, default=256, help="TRL packing length (default 256)")


def run(args) -> int:
    """Audit the built-in tiny pipeline (make_examples + build_model) under each setup; print tables."""
    from packsim.core.data import make_examples
    from packsim.core.errors import PacksimError
    from packsim.core.model import build_model
    from packsim.core.setups import get_setup

    if _wants_preflight(args):
        return _preflight(args)
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


def _wants_preflight(args) -> bool:
    """True for ``--model``; the pre-flight options without it are an error (the demo takes none)."""
    from packsim.core.errors import PacksimError

    given = [f for f, v in (("--data", args.data), ("--collator", args.collator), ("--attn", args.attn),
                            ("--strict", args.strict)) if v]
    if args.model is None and given:
        raise PacksimError(f"{', '.join(given)} need(s) --model DIR: the pre-flight gate is "
                           "packsim audit --model DIR --data FILE.jsonl --collator NAME [--strict].")
    return args.model is not None


def _preflight(args) -> int:
    from packsim.auditing.preflight import COLLATORS, preflight
    from packsim.core.errors import PacksimError

    if args.data is None or args.collator is None:
        raise PacksimError(f"--model needs --data FILE.jsonl and --collator NAME (one of {', '.join(COLLATORS)}).")
    for flag, value in (("--batches", args.batches), ("--batch-size", args.batch_size),
                        ("--max-length", args.max_length)):
        if value < 1:
            raise PacksimError(f"{flag} {value}: must be at least 1.")
    import datasets
    import transformers

    datasets.disable_progress_bars()  # the gate prints one report, not TRL's preparation bars
    transformers.logging.set_verbosity_error()
    report = preflight(args.model, args.data, args.collator, attn=args.attn, batches=args.batches,
                       batch_size=args.batch_size, max_length=args.max_length)
    print(f"=== pre-flight: model {args.model}, data {args.data}, collator {args.collator}, "
          f"attn {args.attn or 'sdpa'}")
    print(report.table())
    gate = "PASS" if report.ok else "FAIL"
    print(f"pre-flight {gate}" + ("" if report.ok else f": {', '.join(report.failed)}"))
    return 1 if args.strict and not report.ok else 0
