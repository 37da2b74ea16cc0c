"""Placeholder: the contamination audit (issue 4) is being written."""

from __future__ import annotations


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    print("packsim audit: not implemented yet")
    return 1
