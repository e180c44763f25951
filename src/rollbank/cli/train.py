"""`rollbank train`: collection + training + weight publication, closed loop.

With no options it runs the embedded default (``rollbank/configs/train.toml``): one managed
vLLM CPU server with the tiny model, terminal-lite's very easy tasks in warm local sandboxes,
the built-in trainer (full fine-tuning), sync mode, 2 steps of 2 groups x 4. Each step: the
batch is written, the trainer steps on it, the weights are saved as ``weights/vNNNNNN`` and
hot-loaded by every engine, which then tags the tokens it generates with the new version.
``--publisher direct`` sends the tensors over vLLM's weight-sync routes instead (checkpoint
written after), ``--publisher lora --finetune lora`` loads a new adapter per version,
``--publisher colocated`` runs the engine inside this process (tensors handed by reference).
Writes ``train.jsonl`` (per step: reward, loss, clip fraction, policy age, versions in the
batch, publication latency, apply pause), ``train_summary.json`` and everything
``rollbank collect`` writes. ``--set key=value`` overrides any dotted config key
(``collect.scheduler.seed=3``, ``trainer.lr=1e-3``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "train", help="collect, train and publish weights in a closed loop", description=__doc__)
    p.add_argument("--config", type=Path, help="TOML config (default: the embedded train.toml)")
    p.add_argument("--mode", choices=("sync", "async"), help="loop mode")
    p.add_argument("--max-lag", type=int, help="async: most versions a trained batch may lag")
    p.add_argument("--inflight", choices=("finish", "abort", "pause"),
                   help="running requests at an update: drain, abort (re-run) or freeze")
    p.add_argument("--publisher", choices=("checkpoint", "direct", "lora", "colocated"),
                   help="weight publication pattern: checkpoint (hot-load a saved folder), "
                   "direct (tensors over vLLM's weight-sync routes), lora (a new adapter per "
                   "version; needs --finetune lora) or colocated (no server: an engine in this "
                   "process gets the tensors by reference)")
    p.add_argument("--steps", type=int, help="optimizer steps (one batch each)")
    p.add_argument("--model", help="'tiny', 'gemma-3-270m' or a local HF folder (served and trained)")
    p.add_argument("--finetune", choices=("full", "lora"), help="trainer: full or LoRA")
    p.add_argument("--tasks", nargs="+", metavar="PATH", help="task folders or suite names")
    p.add_argument("--servers", nargs="+", metavar="URL",
                   help="use these running vLLM servers (started with --enable-scale-out)")
    p.add_argument("--num-servers", type=int, help="managed vLLM servers to start")
    p.add_argument("--groups", type=int, help="groups per batch (G)")
    p.add_argument("--group-size", type=int, help="siblings per group (n)")
    p.add_argument("--out", type=Path, help="output folder")
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
        "mode": "loop.mode", "max_lag": "loop.max_lag", "inflight": "loop.inflight",
        "steps": "loop.steps", "finetune": "trainer.finetune", "tasks": "collect.tasks",
        "publisher": "loop.publisher",
        "num_servers": "collect.inference.managed.num_servers",
        "group_size": "collect.scheduler.bank.group_size",
    }
    for attr, key in simple.items():
        v = getattr(args, attr)
        if v is not None:
            o[key] = v
    if args.tasks is not None:
        o["collect.include"] = []
    if args.model is not None:
        o["trainer.model"] = args.model
        o["collect.inference.managed.model"] = args.model
    if args.servers:
        o["collect.inference.kind"] = "external"
        o["collect.inference.urls"] = args.servers
        o["collect.inference.tokenizer"] = args.model or "tiny"
    if args.groups is not None:
        o["collect.scheduler.groups_per_batch"] = args.groups
        o["collect.scheduler.pool_groups"] = args.groups
    if args.out is not None:
        o["collect.output"] = str(args.out)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        o[key.strip()] = _value(value)
    return o


def for_stream(values: dict[str, Any], *, tty: bool) -> dict[str, Any]:
    """Off a terminal (a log, a CI console) train prints plain progress lines as collect does
    (``collect.metrics.live = "auto"`` unless set) and no progress bars (``TQDM_DISABLE``)."""
    if not tty:
        values = {"collect.metrics.live": "auto", **values}
        os.environ.setdefault("TQDM_DISABLE", "1")
    return values


def run(args: argparse.Namespace) -> int:
    import asyncio
    import time

    from rollbank.errors import RollbankError
    from rollbank.training.loop_config import load_train_config
    from rollbank.training.loop_run import run_train

    t0 = time.monotonic()
    values = for_stream(overrides(args), tty=sys.stderr is not None and sys.stderr.isatty())
    config = load_train_config(args.config, values)

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {line}", file=sys.stderr, flush=True)

    try:
        result = asyncio.run(run_train(config, progress=progress))
    except ExceptionGroup as group:  # task groups wrap the one error that stopped the run
        inner: BaseException = group
        while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
            inner = inner.exceptions[0]
        if isinstance(inner, RollbankError):
            raise inner from group
        raise
    s = result.summary
    out = {
        "output": str(result.out_dir),
        "mode": s["mode"],
        "final_version": s["final_version"],
        "served_version": s["served_version"],
        "run_s": round(time.monotonic() - t0, 2),
        "setup_s": round(s["setup_s"], 2),
        "steps": [{k: r.get(k) for k in ("version", "reward_mean", "loss", "clip_fraction",
                                         "policy_age", "versions", "step_s", "train_s",
                                         "publication_s", "apply_pause_s")}
                  for r in s["steps"]],
        "stale_batches": len(s["stale"]),
        "metrics": str(result.out_dir / "train.jsonl"),
    }
    print(json.dumps(out, indent=2, default=str))
    return 0
