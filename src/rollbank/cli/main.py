"""`rollbank` command line. Thin: each sub-command module registers itself and imports its
heavy dependencies lazily inside its handler, so `rollbank --help` stays instant."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each module exposes `register(subparsers)`; handlers are set with `set_defaults(func=...)`
# and return a process exit code.
COMMAND_MODULES = (
    "rollbank.cli.tasks",
    "rollbank.cli.serve",
    "rollbank.cli.collect",
    "rollbank.cli.replay",
    "rollbank.cli.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollbank",
        description="Collect agentic-RL rollouts and hand a trainer complete GRPO batches.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
