"""The benchmarks by name, for ``rollbank bench NAME`` and the ``rollbank-bench NAME`` script.

Each benchmark module exposes ``add_arguments(parser)`` (cheap) and ``run(args) -> int``
(heavy imports inside). ``rollbank bench`` finds :data:`BENCHES` through this distribution's
``rollbank.bench`` entry point (``rollbank.cli.bench``); a new benchmark is one line here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

BENCHES = {
    "accelsim-fidelity": "rollbank_bench.accelsim_fidelity",
    "faults": "rollbank_bench.faults",
    "sandbox": "rollbank_bench.sandbox",
    "routing": "rollbank_bench.routing",
    "collect": "rollbank_bench.collect",
    "schedule": "rollbank_bench.schedule",
    "host": "rollbank_bench.host",
    "publish": "rollbank_bench.publish",
    "train-step": "rollbank_bench.train_step",
    "soak": "rollbank_bench.soak",
    "learning": "rollbank_bench.learning.command",
    "gateway": "rollbank_bench.gateway",
}


def main(argv: Sequence[str] | None = None) -> int:
    """``rollbank-bench NAME ...`` is ``rollbank bench NAME ...``: the same parser, JSON, typed
    errors, exit codes and signal handling."""
    from rollbank.cli.main import main as rollbank_main

    return rollbank_main(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
