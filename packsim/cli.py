"""The ``packsim`` command line.

- ``packsim doctor``: check the environment (packages, device, attention backends);
- ``packsim compare``: train setups side by side, write ``results.json`` and ``report.html``;
- ``packsim compare-report DIR``: rebuild a comparison's ``report.html`` from ``DIR/results.json``
  (``packsim report DIR``, its old name, still works);
- ``packsim audit``: the pre-flight gate on a local checkpoint and data (``--model DIR --data FILE
  --collator NAME``) or on your own trainer (``--trainer FILE.py:FUNC``), exit codes 0-4 and 130
  (:data:`packsim.auditing.command.EXIT_CODES`); without them, the demo on the built-in tiny
  pipeline under each setup;
- ``packsim train``: train one setup on one process, or data-parallel under torchrun.

:data:`packsim.commands.SUBCOMMANDS` is the list ``packsim --help`` prints (tests/test_docstrings_state_rules.py
holds that this docstring names each one).

Each subcommand is a module of :mod:`packsim.commands`, which provides ``add_arguments(parser)`` and
``run(args) -> int``; this file only wires them up. Imports are lazy and the options come from
modules that do not import torch (``train``'s from :mod:`packsim.scaling.train_options`), so
``--help`` and a bad option answer at once (tests/test_cli.py checks that torch stays unloaded).

Bad input never ends in a traceback: an option argparse rejects, or a :class:`PacksimError`
(or an ``OSError`` on a path) raised by a subcommand, prints one line on stderr,
``packsim <command>: error: <what was wrong and how to fix it>``, and exits with status 2.
Subcommands check their options before any training starts (:mod:`packsim.core.option_checks`). ``python -m packsim`` is the same command line.

Lessons: none directly.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from packsim.commands import ALIASES, OPTIONS, SUBCOMMANDS
from packsim.core.errors import PacksimError
from packsim.core.version import __version__


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``packsim compare: error: ... (see packsim compare --help)``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; bad input exits 2 with one line on stderr (``SystemExit``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)  # the subcommand, if any
    chosen = ALIASES.get(chosen, chosen)
    parser = _Parser(prog="packsim", description="packsim: pack sequences correctly.")
    parser.add_argument("--version", action="version", version=f"packsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)  # subparsers are _Parser too
    for name, (module, help_text) in SUBCOMMANDS.items():
        aliases = [old for old, new in ALIASES.items() if new == name]
        p = sub.add_parser(name, help=help_text, description=help_text, aliases=aliases)
        p.set_defaults(_module=module)
        if name == chosen:  # only the chosen command's options, from a module without torch
            _module(OPTIONS.get(name, module)).add_arguments(p)
    args = parser.parse_args(argv)
    try:
        return int(_module(args._module).run(args) or 0)
    except PacksimError as err:
        _fail(args.command, str(err))
    except OSError as err:  # a path the subcommand could not read or write
        _fail(args.command, f"cannot use {err.filename}: {err.strerror}" if err.filename else str(err))
    except Exception as err:  # noqa: BLE001 -- the gate never reads a crash of its own as "fault found"
        if args.command != "audit":
            raise
        import traceback

        traceback.print_exc()
        print(f"packsim audit: internal error ({type(err).__name__}: {' '.join(str(err).split())[:200]}): "
              "a bug in packsim, not a verdict about your pipeline; please report it with the command "
              "(exit 4)", file=sys.stderr, flush=True)
        raise SystemExit(4) from None


def _fail(command: str, message: str):
    """argparse's style: one line on stderr, exit status 2."""
    print(f"packsim {command}: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _module(name: str):
    return importlib.import_module(name)


if __name__ == "__main__":
    raise SystemExit(main())
