"""The ``packsim`` command line: ``packsim doctor`` checks the environment (more subcommands come with the course)."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="packsim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="check the environment: packages, device, attention backends")
    doctor.add_argument("--quiet", action="store_true", help="print only failures and a summary")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from .check_env import main as check_main

        return check_main(["--quiet"] if args.quiet else [])
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
