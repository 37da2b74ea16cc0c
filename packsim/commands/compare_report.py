"""``packsim compare-report DIR``: rebuild a comparison's ``DIR/report.html`` from ``DIR/results.json``
(the HTML and the tables are :mod:`packsim.viz.comparison_report`'s; ``packsim report`` is its old name,
kept as an alias).

A missing, unreadable or unwritable path, or a results.json that is not a comparison's, raises
:class:`~packsim.core.errors.PacksimError` (one line from :mod:`packsim.cli`, exit 2).

Lessons: none directly.
"""

from __future__ import annotations

from pathlib import Path

from packsim.core.errors import PacksimError
from packsim.experiment.results import Results
from packsim.viz.comparison_report import summary_table, write_report

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """``packsim compare-report DIR``: rebuild ``DIR/report.html`` from ``DIR/results.json``."""
    parser.add_argument("dir", help="folder holding results.json (from packsim compare)")
    parser.add_argument("--out", help="where to write the HTML (default: DIR/report.html)")


def run(args) -> int:
    """``packsim compare-report DIR``: a missing, unreadable or unwritable path raises :class:`PacksimError`."""
    try:
        results = Results.load(args.dir)
    except PacksimError:
        raise
    except (ValueError, KeyError, TypeError) as err:  # not JSON, or not the results schema
        raise PacksimError(f"{args.dir}: its results.json is not a packsim comparison ({err}); "
                           f"run `packsim compare --out {args.dir}` again.") from err
    out = Path(args.out or Path(args.dir) / "report.html")
    try:
        path = write_report(results, out)
    except OSError as err:
        why = f"{out.parent} is a file, not a folder" if out.parent.is_file() else err.strerror
        raise PacksimError(f"cannot write the report to {out} ({why}); "
                           "pass --out with a path you can write to.") from err
    print(summary_table(results))
    print(f"wrote {path}")
    return 0
