"""The ``packsim`` command line.

- ``packsim doctor``: check the environment (packages, device, attention backends);
- ``packsim compare``: train setups side by side, write ``results.json`` and ``report.html``;
- ``packsim report DIR``: rebuild ``report.html`` from ``DIR/results.json``;
- ``packsim audit``: run the contamination audit on the built-in tiny pipeline under each setup.

Each subcommand lives in the module it belongs to, which provides ``add_arguments(parser)`` and
``run(args) -> int``; this file only wires them up (imports are lazy so ``--help`` is fast).
"""

from __future__ import annotations

import argparse
import importlib

# name -> (module, help)
SUBCOMMANDS = {
    "doctor": ("packsim.course.check_env", "check the environment: packages, device, attention backends"),
    "compare": ("packsim.experiment.comparison", "train setups side by side; write results.json and report.html"),
    "report": ("packsim.experiment.report", "rebuild report.html from a comparison's results.json"),
    "audit": ("packsim.auditing.command", "audit the built-in tiny pipeline for contamination under each setup"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="packsim", description="packsim: pack sequences correctly.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        _module(module).add_arguments(p)
    args = parser.parse_args(argv)
    return int(_module(args._module).run(args) or 0)


def _module(name: str):
    return importlib.import_module(name)


if __name__ == "__main__":
    raise SystemExit(main())
