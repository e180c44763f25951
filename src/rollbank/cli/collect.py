"""`rollbank collect`: tasks x model -> trainable batches, event log, report (the main job).

With no options it runs the embedded default (``rollbank/configs/collect.toml``): two managed
vLLM CPU servers with Gemma 3 270M, terminal-lite, warm local sandboxes, one batch of 4x4.
Options override the config; ``--set key=value`` overrides any dotted config key.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "collect", help="collect rollouts into trainable GRPO batches (the main job)",
        description=__doc__)
    p.add_argument("--config", type=Path, help="TOML config (default: the embedded collect.toml)")
    p.add_argument("--tasks", nargs="+", metavar="PATH", help="task folders or suite names")
    p.add_argument("--model", help="'tiny', 'gemma-3-270m' or a local HF model folder")
    p.add_argument("--servers", nargs="+", metavar="URL",
                   help="use these running vLLM servers instead of starting managed ones")
    p.add_argument("--num-servers", type=int, help="managed vLLM servers to start")
    p.add_argument("--groups", type=int, help="groups per batch (G)")
    p.add_argument("--group-size", type=int, help="siblings per group (n)")
    p.add_argument("--pool-groups", type=int, help="groups in flight (G' >= G, over-provisioning)")
    p.add_argument("--batches", type=int, help="batches to collect")
    p.add_argument("--out", type=Path, help="output folder")
    p.add_argument("--prometheus-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted config key (VALUE parsed as JSON, else a string)")
    p.set_defaults(func=run)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    o: dict[str, Any] = {}
    simple = {
        "tasks": "tasks", "num_servers": "inference.managed.num_servers",
        "groups": "scheduler.groups_per_batch", "group_size": "scheduler.bank.group_size",
        "pool_groups": "scheduler.pool_groups", "batches": "scheduler.num_batches",
        "prometheus_port": "metrics.prometheus_port",
    }
    for attr, key in simple.items():
        v = getattr(args, attr)
        if v is not None:
            o[key] = v
    if args.model is not None:
        o["inference.managed.model"] = args.model
    if args.servers:
        o["inference.kind"] = "external"
        o["inference.urls"] = args.servers
        o.setdefault("inference.tokenizer", args.model or "gemma-3-270m")
    if args.out is not None:
        o["output"] = str(args.out)
    if args.groups is not None and args.pool_groups is None:
        o["scheduler.pool_groups"] = max(args.groups, args.groups + (args.groups + 3) // 4)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        o[key.strip()] = _value(value)
    return o


def run(args: argparse.Namespace) -> int:
    import asyncio
    import sys
    import time

    from rollbank.collect_config import load_collect_config
    from rollbank.collector import run_collect
    from rollbank.errors import InputError, RollbankError

    t0 = time.monotonic()
    try:
        config = load_collect_config(args.config, overrides(args))
        result = asyncio.run(run_collect(config))
    except RollbankError as exc:
        print(f"rollbank collect: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, InputError) else 2  # 3: bad input (config, output folder)
    except KeyboardInterrupt:
        print("rollbank collect: interrupted; servers and sandboxes were stopped",
              file=sys.stderr)
        return 130
    out = {
        "output": str(result.out_dir),
        "batches": len(result.batches),
        "collection_s": round(result.collection_s, 2),
        "setup_s": round(result.setup_s, 2),
        "run_s": round(time.monotonic() - t0, 2),
        "time_to_batch_s": [round(b.time_to_batch_s, 2) for b in result.batches],
        "efficiency": [None if b.efficiency is None else round(b.efficiency, 3)
                       for b in result.batches],
        "outcomes": [b.outcomes for b in result.batches],
        "report": str(result.out_dir / "report.html"),
    }
    print(json.dumps(out, indent=2))
    return 0
