"""`rollbank bench {sandbox,routing,collect,schedule,host,publish,train-step,soak,learning,faults,...}`:
benchmarks that print JSON.

The benchmarks are not part of rollbank: they ship in the sibling distribution
``rollbank-bench`` (``bench/`` in the repository; ``scripts/setup.sh`` installs it), found
through its ``rollbank.bench`` entry point (a name -> module mapping; each module exposes
``add_arguments(parser)``, cheap, and ``run(args) -> int``, heavy imports inside). Without
it, ``rollbank bench`` says how to install it and exits 2 (usage)."""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points
from typing import Any

INSTALL = "the benchmarks ship in rollbank-bench: pip install -e bench/ (from a rollbank checkout)"


def benches() -> dict[str, str]:
    """Benchmark name -> module, from every installed ``rollbank.bench`` entry point."""
    found: dict[str, str] = {}
    for ep in entry_points(group="rollbank.bench"):
        found.update(ep.load())
    return found


def register(sub: Any, found: dict[str, str] | None = None) -> None:
    """``rollbank bench``: one sub-command per installed benchmark (``found``: these instead)."""
    p: argparse.ArgumentParser = sub.add_parser("bench", help="benchmarks (JSON output; rollbank-bench)")
    found = benches() if found is None else found
    if not found:
        p.description = INSTALL
        p.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        p.set_defaults(func=_missing)
        return
    bsub = p.add_subparsers(dest="bench", required=True)
    for name, module_name in found.items():
        module = importlib.import_module(module_name)
        bp = bsub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.add_arguments(bp)
        bp.set_defaults(func=module.run)


def _missing(args: argparse.Namespace) -> int:
    print(f"rollbank bench: {INSTALL}", file=sys.stderr)
    return 2
