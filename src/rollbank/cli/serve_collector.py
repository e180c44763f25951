"""`rollbank serve-collector`: a long-running collection a trainer drives over HTTP.

Takes everything `rollbank collect` takes (the same flags and TOML) plus a `[service]` table
(`--service.port`, `--service.lease-s`...). A bearer token is required: export
ROLLBANK_SERVICE_TOKEN (or set --service.token-file). Prints one JSON line with the URL once
listening; routes and a curl example in docs/service.md. Needs `pip install 'rollbank[service]'`.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from rollbank.cli.collect import ALIASES as COLLECT_ALIASES

ALIASES = {**COLLECT_ALIASES, "--port": "service.port", "--host": "service.host"}


def register(sub: Any) -> None:
    from rollbank.cli.flags import add_config_flags
    from rollbank.service.config import ServeCollectorConfig

    p: argparse.ArgumentParser = sub.add_parser(
        "serve-collector", help="run a collection as an HTTP service a trainer drives "
        "(fetch/ack batches, announce weight versions)", description=__doc__,
        usage="%(prog)s [--config FILE] [--port N] [--groups N] ... [--SECTION.FIELD VALUE ...]")
    p.add_argument("--config", type=Path, help="TOML config (default: the embedded collect.toml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted config key (VALUE parsed as JSON, else a string)")
    add_config_flags(p, ServeCollectorConfig, aliases=ALIASES)
    p.set_defaults(func=run)


def config_from(args: argparse.Namespace) -> Any:
    from rollbank.cli.flags import overrides_from
    from rollbank.service.config import load_service_config

    values, origins = overrides_from(args, args.set)
    return load_service_config(args.config, values, origins)


def run(args: argparse.Namespace) -> int:

    from rollbank.service.run import serve_collector

    config = config_from(args)  # a bad flag fails here, before anything starts
    status = serve_collector(config, say=lambda line: print(line, flush=True))
    print(json.dumps({"stopped": status}, default=str), flush=True)
    signum = status.get("signal")
    if signum is not None:  # drained and released; exit as every command does on a signal
        print(f"rollbank serve-collector: {'interrupted' if signum == signal.SIGINT else 'terminated'}",
              file=sys.stderr, flush=True)
        return 130 if signum == signal.SIGINT else 143
    return 0
