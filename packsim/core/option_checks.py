"""Checks every ``packsim`` subcommand runs on its options before any work starts.

Each raises :class:`~packsim.core.errors.PacksimError`, which :mod:`packsim.cli` prints as one
line and exit status 2. They live below every subcommand's module so that each can import them
(the command line dispatches down to the subcommands, never the reverse).

Lessons: none directly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from packsim.core.errors import PacksimError

__all__ = ["check_at_least", "writable_dir"]


def check_at_least(args: argparse.Namespace, minimums: dict[str, int]) -> None:
    """``{"--seeds": 1, ...}``: the first option given below its minimum raises :class:`PacksimError`."""
    for flag, low in minimums.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None and value < low:
            raise PacksimError(f"{flag} {value}: must be at least {low}.")


def writable_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create the folder ``path`` now and check a file can be written in it (before any training)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / ".packsim-write-check").touch()
        (path / ".packsim-write-check").unlink()
    except OSError as err:
        why = "a file, not a folder" if path.is_file() else err.strerror
        raise PacksimError(f"{flag} {path}: cannot write there ({why}); pass a folder you can write to.") from err
    return path
