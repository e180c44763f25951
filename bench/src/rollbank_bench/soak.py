"""`rollbank bench soak`: a long collection on real sandboxes checking that nothing grows.

Runs one collection of ``--batches`` batches with fake inference (``inference.kind = fake``:
the model's time is simulated, the sandboxes, tool commands and verifiers are real) and,
after every batch is handed over, samples this process and the host: open file descriptors,
threads, resident memory, descendant processes, mounts (host mount table), rollbank
cgroups (this process's groups under every hierarchy) and live sandboxes. The first
``--warmup`` batches are excluded (pools, caches and the warm snapshots fill up then); over
the rest a resource is *flat* when its floor (minimum over the second half of the samples)
is at most its allowance above its floor over the first half.
After the collection closes, the same counts must be back at the baseline taken before it
started (nothing leaked by closing; descriptors of installed packages' files, which a library
keeps open once loaded, are not counted).

JSON: the samples per batch, the growth per resource, ``flat`` (all within allowance) and
``leaked_after_close``. Numbers, not timed assertions: the smoke test only checks the shape
and the after-close leak counts.

``--faults`` runs the faulted soak instead (:mod:`rollbank_bench.soak_faults`): continuous
collection for ``--minutes`` on the fault campaign's rig, sampled every ``--interval``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rollbank_bench.soak_probe import sample

#: Allowed growth from the first sample after warm-up to the last (RSS in MiB).
ALLOWANCE = {"fds": 4, "threads": 4, "rss_mib": 32, "processes": 2, "mounts": 0,
             "cgroups": 2, "sandboxes": 0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--json", action="store_true", help="print one JSON object (the default output anyway)")
    a("--batches", type=int, default=20, help="batches collected (samples taken)")
    a("--warmup", type=int, default=2, help="first batches not judged (pools fill up)")
    a("--groups", type=int, default=None, help="G: complete groups per batch (default 2; "
      "--faults: the campaign's 4)")
    a("--group-size", type=int, default=None, help="n: siblings per group (default 2; "
      "--faults: the campaign's 4)")
    f = parser.add_argument_group("faulted soak (rollbank_bench.soak_faults)")
    f.add_argument("--faults", action="store_true", help="continuous collection on the fault "
                   "campaign's rig with faults injected, sampled each --interval, for --minutes")
    f.add_argument("--minutes", type=float, default=30.0, help="--faults: minutes of collection")
    f.add_argument("--interval", type=float, default=60.0, help="--faults: seconds per curve point")
    f.add_argument("--probe", type=float, default=5.0, help="--faults: seconds between probes")
    f.add_argument("--warmup-minutes", type=int, default=2,
                   help="--faults: first intervals not judged")
    f.add_argument("--seed", type=int, default=0, help="--faults: fault schedule seed")
    f.add_argument("--rate", type=float, default=0.6, help="--faults: share of attempts faulted")
    f.add_argument("--plot", default=None, help="--faults: write the curve as a PNG here")
    f.add_argument("--keep-rounds", action="store_true",
                   help="--faults: keep each round's run folder (default: deleted once judged)")
    a("--tasks", default="hello-greeting,count-lines", help="terminal-lite tasks, comma-separated")
    a("--out", default=None, help="run folder (default: a temporary one, deleted)")


def judge(samples: list[dict[str, float]], warmup: int) -> dict[str, Any]:
    """Growth of each resource's *floor* over the judged samples: the minimum of their second
    half minus the minimum of their first half (a sample taken at a batch hand-off includes
    whatever is in flight then; a leak raises the floor), and whether each stays within its
    allowance."""
    judged = samples[warmup:] if len(samples) > warmup + 1 else samples
    half = max(1, len(judged) // 2)
    first, second = judged[:half], judged[half:] or judged[:half]
    growth = ({k: round(min(x[k] for x in second) - min(x[k] for x in first), 1)
               for k in ALLOWANCE} if judged else {})
    return {"judged_samples": len(judged), "growth": growth,
            "flat": bool(judged) and all(growth[k] <= ALLOWANCE[k] for k in ALLOWANCE)}


async def soak(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from rollbank.collect_config import load_collect_config
    from rollbank.collector import collect
    from rollbank.episodes.sandboxes import open_sandboxes
    from rollbank.inference_plane import open_inference
    from rollbank.task_selection import select_tasks

    overrides: dict[str, object] = {
        "include": [t.strip() for t in args.tasks.split(",") if t.strip()], "output": str(out),
        "metrics.live": "off", "inference.kind": "fake", "runner.max_turns": 2,
        "scheduler.groups_per_batch": args.groups, "scheduler.pool_groups": args.groups,
        "scheduler.bank.group_size": args.group_size, "scheduler.num_batches": args.batches,
        "scheduler.bank.dynamic_sampling.enabled": False,
        "scheduler.sandbox_slots": max(2, args.groups * args.group_size),
    }
    cfg = await asyncio.to_thread(load_collect_config, None, overrides)
    tasks = await asyncio.to_thread(select_tasks, cfg)
    baseline = await asyncio.to_thread(sample, lambda: 0)
    samples: list[dict[str, float]] = []
    t0 = time.monotonic()
    async with open_inference(cfg.inference, max_model_len=cfg.runner.max_model_len) as plane, \
            open_sandboxes(cfg.sandbox, tasks) as sandboxes:
        source: Any = sandboxes.source  # warm: its pool's backend; cold: its own
        backend = source.pool.backend if hasattr(source, "pool") else source.backend

        def n_live() -> int:
            return len(backend.sandboxes)

        async def on_batch(batch: Any, path: Path) -> None:
            samples.append({"batch": len(samples), **await asyncio.to_thread(sample, n_live)})

        await collect(cfg, tasks=tasks, inference=plane, sandboxes=sandboxes, out_dir=out,
                      on_batch=on_batch)
    after = await asyncio.to_thread(sample, lambda: 0)
    leaked = {k: round(after[k] - baseline[k], 1) for k in ("fds", "processes", "mounts", "cgroups")}
    return {"bench": "soak", "batches": len(samples), "wall_s": round(time.monotonic() - t0, 1),
            "groups": args.groups, "group_size": args.group_size, "tasks": [t.task_id for t in tasks],
            "allowance": ALLOWANCE, "samples": samples, **judge(samples, args.warmup),
            "baseline": baseline, "after_close": after, "leaked_after_close": leaked}


def run(args: argparse.Namespace) -> int:
    if args.faults:
        from rollbank_bench import soak_faults  # the faulted soak (imports the probe, not us)

        return soak_faults.run(args)
    args.groups = 2 if args.groups is None else args.groups
    args.group_size = 2 if args.group_size is None else args.group_size
    if args.out:
        report = asyncio.run(soak(args, Path(args.out)))
    else:
        with tempfile.TemporaryDirectory(prefix="rollbank-soak-") as tmp:
            report = asyncio.run(soak(args, Path(tmp)))
    print(json.dumps(report, indent=2))
    return 0 if report["flat"] and not any(report["leaked_after_close"].values()) else 1
