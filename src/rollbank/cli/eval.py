"""`rollbank eval`: run a task suite on the engine, precision and weights that will serve.

Every attempt counts (no over-provisioning, no first-finished selection, no re-runs): each
task gets exactly --attempts attempts, and the report gives pass@1 / pass@k (unbiased
estimator), the outcome taxonomy, p50/p95/p99 time to first token and per-request tokens/s,
and cost per solved task (engine-seconds and sandbox-seconds per success). `--model A B`
evaluates several models or checkpoint folders side by side (one row each). Every field of
the collect configuration is a flag, as for `rollbank collect`. Writes the eval result,
<out>/eval.json (one row per model) and <out>/results.jsonl (one line per model and task:
attempts, successes, solve_rate), and one folder per model (episodes, events, report; no
training batch); prints the JSON, then a short table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: collect's short spellings that do not clash with eval's own flags
ALIASES = {"--tasks": "tasks", "--num-servers": "inference.managed.num_servers",
           "--prometheus-port": "metrics.prometheus_port"}


def register(sub: Any) -> None:
    from rollbank.cli.flags import add_config_flags
    from rollbank.collect_config import CollectConfig

    p: argparse.ArgumentParser = sub.add_parser(
        "eval", help="evaluate models/checkpoints on a task suite (pass@k, latency, cost)",
        description=__doc__,
        usage="%(prog)s [--config FILE] [--model A B ...] [--attempts N] [--k K ...] [--out DIR] "
        "[--SECTION.FIELD VALUE ...]")
    p.add_argument("--config", type=Path, help="collect TOML config (default: the embedded collect.toml)")
    p.add_argument("--model", nargs="+", default=[], metavar="MODEL",
                   help="models or checkpoint folders to evaluate side by side (managed servers)")
    p.add_argument("--attempts", type=int, default=4, help="attempts per task (default 4)")
    p.add_argument("--k", nargs="+", type=int, default=[], metavar="K",
                   help="k values of pass@k (default: 1 and --attempts)")
    p.add_argument("--out", default="runs/eval", help="output folder (default runs/eval)")
    p.add_argument("--servers", nargs="+", metavar="URL",
                   help="evaluate the model these running vLLM servers serve "
                   "(= --inference.kind external --inference.urls URL...)"
                   "; the tokenizer is --inference.tokenizer (a model folder or name, default --model); a standard `vllm serve` works, its weight versions then come from rollbank's own publication records (--inference.external-versions); per-token versions from the engine need VLLM_SERVER_DEV_MODE=1 and --enable-scale-out")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted config key (VALUE parsed as JSON, else a string)")
    add_config_flags(p, CollectConfig, aliases=ALIASES)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from rollbank.cli.flags import overrides_from
    from rollbank.collect_config import load_collect_config
    from rollbank.errors import UsageError
    from rollbank.evaluation.run import EvalOptions, label_of, run_eval, table

    values, origins = overrides_from(args, args.set)
    if args.servers:
        values.update({"inference.kind": "external", "inference.urls": args.servers})
        origins.update({"inference.kind": "--servers", "inference.urls": "--servers"})
        values.setdefault("inference.tokenizer", "gemma-3-270m")
    config = load_collect_config(args.config, values, origins)
    try:
        options = EvalOptions(attempts=args.attempts, ks=args.k, models=args.model, output=args.out)
    except ValidationError as exc:
        raise UsageError(f"--attempts/--k: {exc.errors()[0]['msg']}") from exc
    doc = run_eval(config, options)
    print(json.dumps(doc, indent=2, default=str))
    print()
    print(table(doc))
    out = Path(args.out)
    for r in doc["rows"]:
        print(f"[rollbank] eval: {label_of(str(r['model']))}: {r['tasks']} task(s) x "
              f"{r['attempts_per_task']} attempts, {r['successes']} solved, set-up "
              f"{r['setup_s']:.0f} s, evaluation {r['wall_s']:.0f} s", file=sys.stderr, flush=True)
    print(f"[rollbank] eval result written to {out / 'eval.json'} (pass@k, outcomes, per-task "
          f"solve rates) and {out / 'results.jsonl'} (one line per model and task)",
          file=sys.stderr, flush=True)
    return 0
