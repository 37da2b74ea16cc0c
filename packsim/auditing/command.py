"""``packsim audit``: the pre-flight gate on the pipeline a run would train, or the built-in demo.

As a gate it audits the pipeline a run would train and prints the report:

- ``--model DIR --data FILE.jsonl --collator NAME [--attn IMPL]``: the pipeline that checkpoint,
  data and collator would train (:mod:`packsim.auditing.preflight`);
- ``--trainer path/to/train.py:make_trainer`` (or ``module:function``): the Trainer / SFTTrainer the
  user's own factory returns, with their config, collator, dtype and attention implementation
  (:mod:`packsim.auditing.factory`); a model it loads with ``flash_attention_2`` where flash-attn
  cannot run gets transformers' flash path on the reference kernel
  (:func:`packsim.reference.flash_emulation.reference_for_flash_requests`), named in a notice, as
  ``--model --attn flash_attention_2`` does.

Exit codes (:data:`EXIT_CODES`), so a CI job or a launch script can stop before training: 0 the
audit passed, 1 it found a fault, 2 bad input or setup (one line on stderr, never a traceback),
3 nothing could be measured (e.g. one example per batch: isolation untested, not a pass) or
``--timeout`` ran out, 4 the audit itself crashed, 130 interrupted (Ctrl-C); each of 3 (timeout),
130 and a factory's ``sys.exit(N)`` (exit 2: no code of the factory's own leaks out) is one line.
``--timeout SECONDS`` bounds the factory and the audit together (:class:`Deadline`): ``SIGALRM``
raises :class:`GateTimeout` in the main thread (a ``BaseException``, so no ``except Exception`` of
the user's code swallows it); a watchdog thread ends the process with ``os._exit(3)`` and the same
line where the signal cannot get through (a C call that never returns: 10 s later) or is not
available (Windows, or the gate run from another thread: at once).
Without ``--model`` or ``--trainer`` the ``packsim audit`` command (:mod:`packsim.commands.audit`) runs
the demo (:mod:`packsim.exhibits.gate_demo`: the built-in tiny pipeline audited under each setup, its
tables printed, exit 0) inside the same deadline and Ctrl-C handling.
The options import nothing heavy (torch comes with the run), so a bad option answers at once.

Lessons: none directly.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading

EXIT_CODES = {0: "the audit passed", 1: "the audit found a fault (a leak, a wrong label, a bad setting)",
              2: "bad input or setup (unreadable or non-UTF-8 data, not a checkpoint, a tokenizer that "
                 "does not fit the model, a factory that does not load): one line on stderr",
              3: "not measured (e.g. every batch holds one example, or the --attn you launch cannot run "
                 "here), or unverified (isolated only as the batch's own boundary fields mark the examples, "
                 "nothing independent locating them; --trust-boundaries when they are the ground truth), "
                 "or --timeout ran out (one line naming what was running): not a pass",
              4: "the audit itself crashed (a bug in packsim, with its traceback): not a verdict",
              130: "interrupted (Ctrl-C): one line, no verdict"}
EPILOG = ("exit codes of the gate (--model or --trainer):\n"
          + "".join(f"  {code}  {text}\n" for code, text in EXIT_CODES.items())
          + "severity: a fault (a leak, a wrong label, loss over the wrong tokens) is exit 1; a setting the\n"
          "trainer did not honour while corrupting nothing (DPO's padding_free falling back to padding) is a\n"
          "NOTICE beside a PASS (exit 0), exit 1 with --strict.\n"
          + "without --model or --trainer the demo prints its tables and exits 0.")


def add_arguments(parser) -> None:
    """``packsim audit`` options: which setups, the seed, and the size of the demo batch."""
    import argparse

    from packsim.core.setups import SETUPS

    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter

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
    pre.add_argument("--strict", action="store_true",
                     help="a setting the trainer did not honour while corrupting nothing (a NOTICE, e.g. DPO's "
                          "padding fallback) fails the gate (exit 1)")
    pre.add_argument("--trust-boundaries", action="store_true",
                     help="the batch's own boundary fields are the ground truth: an isolated verdict that rests "
                          "on them alone is a PASS, not UNVERIFIED (exit 3)")
    pre.add_argument("--objective", choices=("sft", "lm"), default="sft",
                     help="what the loss should count: sft (default) checks completion-only fine-tuning "
                          "(prompt labels -100, responses and EOS counted); lm (pretraining-style language "
                          "modelling) expects every real token to be a target, no prompt/response split, "
                          "padding and cross-boundary labels still checked (with --model the gate builds "
                          "the collator so: each record's prompt + completion is one text)")
    pre.add_argument("--batches", type=int, default=1, help="training batches to audit (default 1)")
    pre.add_argument("--batch-size", type=int, default=4, help="per-device batch size (default 4)")
    pre.add_argument("--max-length", type=int, default=256, help="TRL packing length (default 256)")
    pre.add_argument("--timeout", type=float, metavar="SECONDS",
                     help="bound the gate (with --trainer: the factory and the audit together); on expiry one "
                          "line names what was running and the exit is 3 (not measured)")
    own = parser.add_argument_group("gate your own trainer")
    own.add_argument("--trainer", metavar="FILE.py:FUNC",
                     help="path/to/train.py:make_trainer or package.module:make_trainer, a function "
                          "taking no arguments that returns the Trainer / SFTTrainer you train with; "
                          "its config, collator, dtype and attention are audited as they are "
                          "(with --batches)")


class GateTimeout(BaseException):
    """``--timeout`` ran out (a BaseException: the user's ``except Exception`` cannot swallow it)."""


class Deadline:
    """``with Deadline(seconds):`` bounds the block (None: unbounded); ``what`` names the running part."""

    GRACE_S = 10.0  # how long the signal gets before the watchdog ends the process

    def __init__(self, seconds: float | None, what: str = "the gate"):
        if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
            from packsim.core.errors import PacksimError

            raise PacksimError(f"--timeout {seconds}: give a positive number of seconds, e.g. --timeout 600.")
        self.seconds, self.what = seconds, what
        self._signal = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()

    def line(self) -> str:
        return (f"not measured: --timeout {self.seconds:g} s ran out while {self.what} was running: no verdict, "
                "not a pass; give it more time (--timeout), or find what hangs (python -X faulthandler)")

    def _expire(self, signum, frame):
        raise GateTimeout(self.line())

    def _hard_exit(self):
        print(f"packsim audit: {self.line()} (exit 3)", file=sys.stderr, flush=True)
        os._exit(3)

    def __enter__(self):
        if self.seconds is not None:
            self._watchdog = threading.Timer(self.seconds + (self.GRACE_S if self._signal else 0), self._hard_exit)
            self._watchdog.daemon = True
            if self._signal:
                self._previous = signal.signal(signal.SIGALRM, self._expire)
                signal.setitimer(signal.ITIMER_REAL, self.seconds)
            self._watchdog.start()
        return self

    def __exit__(self, *exc):
        if self.seconds is not None:
            self._watchdog.cancel()
            if self._signal:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, self._previous)
        return False


def run(args, demo=None) -> int:
    """The gate (--trainer, --model) or ``demo(args)`` (the command's: :mod:`packsim.exhibits.gate_demo`,
    which the gate's room cannot import), with --timeout and Ctrl-C answered in one line (exit 3, 130)."""
    clock = Deadline(getattr(args, "timeout", None), "the demo")
    try:
        with clock:
            if getattr(args, "trainer", None):
                return _own_trainer(args, clock)
            if _wants_preflight(args):
                return _preflight(args, clock)
            if demo is None:
                from packsim.core.errors import PacksimError

                raise PacksimError("packsim audit needs --model DIR --data FILE.jsonl --collator NAME or "
                                   "--trainer FILE.py:FUNC (the demo runs from the packsim command).")
            return demo(args)
    except GateTimeout as err:
        print(f"packsim audit: {err} (exit 3)", file=sys.stderr, flush=True)
        return 3
    except KeyboardInterrupt:
        print(f"packsim audit: interrupted (Ctrl-C) while {clock.what} was running: no verdict (exit 130)",
              file=sys.stderr, flush=True)
        return 130


def _wants_preflight(args) -> bool:
    """True for ``--model``; the pre-flight options without it are an error (the demo takes none)."""
    from packsim.core.errors import PacksimError

    given = [f for f, v in (("--data", args.data), ("--collator", args.collator), ("--attn", args.attn),
                            ("--strict", args.strict), ("--trust-boundaries", args.trust_boundaries),
                            ("--objective", getattr(args, "objective", "sft") != "sft"),
                            ("--timeout", getattr(args, "timeout", None) is not None)) if v]
    if args.model is None and given:
        raise PacksimError(f"{', '.join(given)} need(s) --model DIR: the pre-flight gate is "
                           "packsim audit --model DIR --data FILE.jsonl --collator NAME, or packsim audit --trainer "
                           "FILE.py:FUNC.")
    return args.model is not None


def _quiet() -> None:
    import os

    import transformers

    # the gate prints one report, not TRL's dataset preparation bars; datasets reads this when TRL
    # imports it (only the TRL paths do: packsim.core.trainer_import keeps it out of the others)
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # nor "Loading weights" bars on stderr


def exit_code(report) -> int:
    """0 pass, 1 fault, 3 not measured (:data:`EXIT_CODES`; 2 is raised as PacksimError before)."""
    return {"pass": 0, "fail": 1, "not measured": 3, "unverified": 3}[report.status]


def _gate_line(report) -> str:
    if report.status == "fail":
        return f"FAIL: {', '.join(report.failed)}"
    if report.status == "unverified":
        return "UNVERIFIED: isolated only as the batch's own boundary fields say, not a pass"
    return "NOT MEASURED: isolation untested, not a pass" if report.status == "not measured" else "PASS"


def _own_trainer(args, clock: Deadline) -> int:
    from packsim.auditing.factory import load_trainer
    from packsim.auditing.preflight import check_tokenizer
    from packsim.auditing.trainer import audit_trainer
    from packsim.core.errors import PacksimError
    from packsim.core.option_checks import check_at_least
    from packsim.core.trainer_import import import_trainer
    from packsim.reference.flash_emulation import reference_for_flash_requests

    given = [f for f, v in (("--model", args.model), ("--data", args.data), ("--collator", args.collator),
                            ("--attn", args.attn)) if v]
    if given:
        raise PacksimError(f"--trainer builds the whole pipeline, so {', '.join(given)} cannot go with it: set "
                           "them in your factory.")
    check_at_least(args, {"--batches": 1})
    _quiet()
    import_trainer()  # before the factory imports it: datasets only if the factory itself needs it
    # a factory asking for flash_attention_2 where flash-attn cannot run gets the reference kernel, as --attn does
    with reference_for_flash_requests() as flash:
        clock.what = f"the trainer factory {args.trainer}"
        trainer = load_trainer(args.trainer)
        clock.what = f"the audit of the trainer from {args.trainer}"
        tokenizer = getattr(trainer, "processing_class", None)
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
        if tokenizer is not None and hasattr(tokenizer, "__len__") and hasattr(trainer.model, "get_input_embeddings"):
            check_tokenizer(trainer.model, tokenizer, [], f"--trainer {args.trainer}")
        try:
            report = audit_trainer(trainer, batches=args.batches, strict=args.strict,
                                   trust_boundaries=args.trust_boundaries, objective=args.objective)
        except PacksimError as err:
            raise PacksimError(f"--trainer {args.trainer}: {err}") from None
        except SystemExit as err:  # the trainer's own code (a collator, compute_loss) exiting mid-audit
            raise PacksimError(f"--trainer {args.trainer}: the trainer's own code called sys.exit({err.code!r}) "
                               "during the audit of its first batches: nothing was measured; remove the "
                               "sys.exit from the code a training step runs.") from None
    if flash.models:
        report.findings.append(_flash_notice(flash))
    print(f"=== audit of the trainer from {args.trainer}: {type(trainer).__name__}")
    print(report.console())
    print(f"gate {_gate_line(report)}")
    return exit_code(report)


def _flash_notice(flash):
    """The notice that the factory's flash_attention_2 ran on the reference kernel (as the --attn path says it)."""
    from packsim.auditing.report import Finding

    emulated = flash.emulation
    return Finding(
        "flash_attention_2", "notice", f"{', '.join(dict.fromkeys(flash.models))} asked for flash_attention_2, "
        "which cannot run here (it needs CUDA and the flash-attn package), so it ran through transformers' own "
        "flash-attention path (unpadding, cu_seq_lens_*, packed-sequence detection from position_ids: transformers' "
        f"code) on {emulated.kernel} as attn_implementation={emulated.name!r}: what decides isolation is measured; "
        "the real kernel's bf16 numerics and speed are not", "on a GPU with flash-attn installed the real kernel "
        "runs instead")


def _preflight(args, clock: Deadline) -> int:
    from packsim.auditing.preflight import COLLATORS, preflight
    from packsim.core.errors import PacksimError
    from packsim.core.option_checks import check_at_least

    if args.data is None or args.collator is None:
        raise PacksimError(f"--model needs --data FILE.jsonl and --collator NAME (one of {', '.join(COLLATORS)}).")
    check_at_least(args, {"--batches": 1, "--batch-size": 1, "--max-length": 1})
    _quiet()
    clock.what = f"the pre-flight audit of --model {args.model} (loading it, reading --data, the probes)"
    report = preflight(args.model, args.data, args.collator, attn=args.attn, batches=args.batches,
                       batch_size=args.batch_size, max_length=args.max_length, strict=args.strict,
                       trust_boundaries=args.trust_boundaries, objective=args.objective)
    print(f"=== pre-flight: model {args.model}, data {args.data}, collator {args.collator}, "
          f"attn {args.attn or 'default (sdpa; eager where the architecture refuses sdpa)'}")
    print(report.console())
    print(f"pre-flight {_gate_line(report)}")
    return exit_code(report)
