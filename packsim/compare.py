"""Placeholder: ``packsim compare`` (issue 3) is being written."""

from __future__ import annotations


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    print("packsim compare: not implemented yet")
    return 1
