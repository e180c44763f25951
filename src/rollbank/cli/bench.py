"""`rollbank bench {sandbox,routing,collect,schedule,host,publish,train-step,soak,learning,faults,...}`:
benchmarks that print JSON.

Each benchmark module exposes ``add_arguments(parser)`` (cheap) and ``run(args) -> int``
(heavy imports inside)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

BENCHES = {
    "accelsim-fidelity": "rollbank.bench.accelsim_fidelity",
    "faults": "rollbank.bench.faults",
    "sandbox": "rollbank.bench.sandbox",
    "routing": "rollbank.bench.routing",
    "collect": "rollbank.bench.collect",
    "schedule": "rollbank.bench.schedule",
    "host": "rollbank.bench.host",
    "publish": "rollbank.bench.publish",
    "train-step": "rollbank.bench.train_step",
    "soak": "rollbank.bench.soak",
    "learning": "rollbank.bench.learning.command",
}


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("bench", help="benchmarks (JSON output)")
    bsub = p.add_subparsers(dest="bench", required=True)
    for name, module_name in BENCHES.items():
        module = importlib.import_module(module_name)
        bp = bsub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.add_arguments(bp)
        bp.set_defaults(func=module.run)
