"""``rollbank bench learning --engine vllm --seeds 0,1,2``: the real loop over several seeds.

Each seed is one :func:`~rollbank_bench.learning.real_loop.measure_vllm` run (its own
``rollbank train`` with a fresh managed vLLM server, its own training pool, scheduler seed and
task order; the same warmed start and the same held-out set) in ``OUT/seed-N``. Per seed, four
paired start/end numbers:

- ``reward``: mean batch reward of the first ``k`` steps vs the last ``k`` steps
  (``k = max(1, steps // 4)``; the batches are the loop's own, scored by the tasks' verifiers);
- ``held_out``: the held-out eval solve rate of version 0 vs the final version;
- ``train_tasks``: the same evaluation on as many training-pool tasks.

Across seeds: mean +- standard error (sample s.d. / sqrt(n)) of start, end and the paired
difference end - start, and the stated test: **learned** when the mean paired difference is
above 0 by more than 2 standard errors (``diff_mean - 2 * diff_se > 0``), needing >= 3 seeds.
Seeds are fixed by the command line before any result is seen.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MIN_SEEDS = 3
METRICS = ("reward", "held_out", "train_tasks")


def mean_se(xs: Sequence[float]) -> dict[str, float | int | None]:
    """Mean and standard error (sample s.d. / sqrt(n); None for n < 2) of ``xs``."""
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": None, "se": None}
    m = math.fsum(xs) / n
    if n < 2:
        return {"n": n, "mean": m, "se": None}
    var = math.fsum((x - m) ** 2 for x in xs) / (n - 1)
    return {"n": n, "mean": m, "se": math.sqrt(var / n)}


def seed_points(doc: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Start and end of each metric for one seed's run document."""
    rewards = [float(s["reward_mean"]) for s in doc.get("steps", [])]
    k = max(1, len(rewards) // 4)
    s = doc["summary"]
    return {
        "reward": {"start": math.fsum(rewards[:k]) / k if rewards else None,
                   "end": math.fsum(rewards[-k:]) / k if rewards else None, "window_steps": k},
        "held_out": {"start": s["eval_start"], "end": s["eval_final"]},
        "train_tasks": {"start": s["train_tasks_eval_start"], "end": s["train_tasks_eval_final"]},
    }


def learned_test(points: Sequence[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Across seeds, per metric: start, end and paired end - start as mean +- s.e.; the test."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        pairs = [(p[metric]["start"], p[metric]["end"]) for p in points
                 if p[metric]["start"] is not None and p[metric]["end"] is not None]
        diff = mean_se([e - s for s, e in pairs])
        n, m, se = diff["n"], diff["mean"], diff["se"]
        ok = n is not None and n >= MIN_SEEDS and m is not None and se is not None and m - 2 * se > 0
        out[metric] = {"start": mean_se([s for s, _ in pairs]), "end": mean_se([e for _, e in pairs]),
                       "diff": diff, "learned": bool(ok)}
    return out


def verdict(test: dict[str, Any]) -> str:
    parts = []
    for metric in METRICS:
        d = test[metric]["diff"]
        if d["mean"] is None:
            parts.append(f"{metric}: no data")
            continue
        se = "n/a" if d["se"] is None else f"{d['se']:.3f}"
        parts.append(f"{metric}: end - start {d['mean']:+.3f} +- {se} (n={d['n']}) -> "
                     f"{'learned' if test[metric]['learned'] else 'not shown'}")
    return "; ".join(parts)


def plot(docs: Sequence[dict[str, Any]], test: dict[str, Any], path: Path) -> str:
    from rollbank.metrics.report import plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    for d in docs:
        steps = d["steps"]
        ax[0].plot([s["version"] for s in steps], [s["reward_mean"] for s in steps], marker="o",
                   ms=3, alpha=0.7, label=f"seed {d['settings']['seed']}")
    ax[0].set(xlabel="version (optimizer steps)", ylabel="batch reward (verifier)",
              title="rollbank train: batch reward per step, each seed")
    ax[0].legend(fontsize=8)
    names = {"reward": "batch reward", "held_out": "held-out eval", "train_tasks": "train-pool eval"}
    xs = range(len(METRICS))
    for k, (which, off) in enumerate((("start", -0.15), ("end", 0.15))):
        means = [test[m][which]["mean"] or 0.0 for m in METRICS]
        errs = [2 * (test[m][which]["se"] or 0.0) for m in METRICS]
        ax[1].bar([x + off for x in xs], means, width=0.3, yerr=errs, capsize=4,
                  label=f"{which} (mean +- 2 s.e.)", color=f"C{k}")
    ax[1].set_xticks(list(xs), [names[m] for m in METRICS])
    ax[1].set(ylabel="solve rate", title=f"start vs end over {len(docs)} seeds")
    ax[1].legend(fontsize=8)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path.name


def measure_seeds(args: argparse.Namespace, seeds: Sequence[int],
                  run_one: Callable[[argparse.Namespace], dict[str, Any]] | None = None
                  ) -> dict[str, Any]:
    """One real-loop run per seed in ``OUT/seed-N``, then the across-seed test (JSON + PNG)."""
    if run_one is None:
        from rollbank_bench.learning.real_loop import measure_vllm

        run_one = measure_vllm
    out = args.out or Path("runs") / time.strftime("bench-learning-vllm-%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    docs = []
    for seed in seeds:
        one = copy.copy(args)
        one.seed, one.out = seed, out / f"seed-{seed}"
        docs.append(run_one(one))
    points = [seed_points(d) for d in docs]
    test = learned_test(points)
    doc: dict[str, Any] = {
        "bench": "learning", "engine": docs[0]["engine"] if docs else "vllm",
        "model": docs[0]["model"] if docs else None, "seeds": list(seeds),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                     if k not in ("func", "seed", "out")},
        "test": "learned = mean paired (end - start) > 2 standard errors above 0, over >= "
                f"{MIN_SEEDS} seeds; reward = mean batch reward of the first vs the last "
                "quarter of the steps; held_out / train_tasks = eval solve rate of version 0 "
                "vs the final version",
        "per_seed": [{"seed": s, "error": d.get("error"), "final_version": d.get("final_version"),
                      "run_seconds": d.get("run_seconds"), **p}
                     for s, d, p in zip(seeds, docs, points, strict=True)],
        "across_seeds": test, "verdict": verdict(test),
        "seconds": time.perf_counter() - t0,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "runs": [{k: v for k, v in d.items() if k != "batches"} for d in docs],
        "out": str(out),
    }
    doc["plot"] = plot(docs, test, out / "learning_seeds.png")
    (out / "bench-learning-vllm-seeds.json").write_text(json.dumps(doc, indent=2, default=str))
    return doc
