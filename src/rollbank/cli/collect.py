"""`rollbank collect`: tasks x model -> trainable batches, event log, report (the main job).

With no options it runs the embedded default (rollbank/configs/collect.toml). Every field of
the configuration is a flag (`--scheduler.groups-per-batch 8`, generated from the config
models: their descriptions are the help below); common ones have short aliases (`--groups`).
`--set KEY=VALUE` sets any dotted key too. A bad value is reported as the flag that gave it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

#: Short spellings of the most used fields (help and checks come from the field itself).
ALIASES = {
    "--tasks": "tasks",
    "--model": "inference.managed.model",
    "--num-servers": "inference.managed.num_servers",
    "--groups": "scheduler.groups_per_batch",
    "--group-size": "scheduler.bank.group_size",
    "--pool-groups": "scheduler.pool_groups",
    "--batches": "scheduler.num_batches",
    "--out": "output",
    "--prometheus-port": "metrics.prometheus_port",
    "--ray": "sandbox.ray.address",
}


def register(sub: Any) -> None:
    from rollbank.cli.flags import add_config_flags
    from rollbank.collect_config import CollectConfig

    p: argparse.ArgumentParser = sub.add_parser(
        "collect", help="collect rollouts into trainable GRPO batches (the main job)",
        description=__doc__,
        usage="%(prog)s [--config FILE] [--groups N] [--model NAME] ... [--SECTION.FIELD VALUE ...]")
    p.add_argument("--config", type=Path, help="TOML config (default: the embedded collect.toml)")
    p.add_argument("--servers", nargs="+", metavar="URL",
                   help="use these running vLLM servers instead of starting managed ones "
                   "(= --inference.kind external --inference.urls URL...)"
                   "; the tokenizer is --inference.tokenizer (a model folder or name, default --model); a standard `vllm serve` works, its weight versions then come from rollbank's own publication records (--inference.external-versions); per-token versions from the engine need VLLM_SERVER_DEV_MODE=1 and --enable-scale-out")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted config key (VALUE parsed as JSON, else a string)")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR",
                   help="continue a crashed run in RUN_DIR with its config.resolved.json "
                   "(written batches are kept, the remaining ones collected; other config "
                   "flags are ignored)")
    add_config_flags(p, CollectConfig, aliases=ALIASES)
    p.set_defaults(func=run)


def config_from(args: argparse.Namespace) -> Any:
    """The resolved config of a `rollbank collect` command line."""
    from rollbank.cli.flags import overrides_from
    from rollbank.collect_config import load_collect_config

    values, origins = overrides_from(args, args.set)
    if args.servers:
        values.update({"inference.kind": "external", "inference.urls": args.servers})
        origins.update({"inference.kind": "--servers", "inference.urls": "--servers"})
        model = values.get("inference.managed.model")
        values.setdefault("inference.tokenizer", model or "gemma-3-270m")
    return load_collect_config(args.config, values, origins)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import time

    from rollbank.collector import run_collect

    t0 = time.monotonic()
    plan = None
    if args.resume is not None:
        from rollbank.resume import prepare_resume

        plan = prepare_resume(args.resume)
        config = plan.config
    else:
        config = config_from(args)
    result = asyncio.run(run_collect(config, resume=plan))
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
