"""The learning-integrity experiment: sync vs gated async vs ungated async GRPO (JSON + PNGs).

``rollbank bench learning``: warm up the tiny model to the action format
(:mod:`rollbank_bench.learning.warmup`), then run, on the same seeds and prompts, the arms
``sync`` (lag 0), ``gated`` (lag ``--lag``, divergence gate + token TIS) and ``ungated``
(lag ``--lag``, no gate, no correction), plus ungated arms at every ``--sweep-lags`` lag.
``--arms`` picks a subset of the three (sync always runs). ``--merge`` adds the arms of earlier
runs with the same settings (more seeds), and ``across_seeds`` aggregates every seed
(:mod:`rollbank_bench.learning.aggregate`). Arms run in ``--parallel`` worker processes. Prints one JSON document (settings, warm-up,
per-arm steps/evals, summaries, verdict) and writes it with the curves (PNG) to ``--out``.
``--quick``: a few steps of every arm (an integration smoke test, not a learning claim).
``--engine vllm``: the real loop instead (``rollbank train``: a vLLM server, sandboxes, the
task's verifier, publication; :mod:`rollbank_bench.learning.real_loop`), one run per seed of
``--seeds``; with several, the across-seed start/end test (:mod:`rollbank_bench.learning.real_seeds`).
See docs/learning.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rollbank.staleness.config import CorrectionMode

STEPS = 60  # the default setting, chosen by docs/learning.md "Finding a setting where sync learns"
LR = 3e-4
KL_COEF = 0.05  # chosen on dev seeds 100-105 (docs/learning.md, "Held-out seeds with a KL anchor")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a few steps per arm (smoke test); "
                        "its sizes are caps: a smaller explicit --steps/--prompts/--group-size/"
                        "--eval-size/--warmup-steps wins")
    parser.add_argument("--steps", type=int, default=STEPS, help="optimizer steps per arm")
    parser.add_argument("--prompts", type=int, default=8, help="groups (prompts) per step")
    parser.add_argument("--group-size", type=int, default=8, help="attempts per prompt")
    parser.add_argument("--lr", type=float, default=LR, help="AdamW learning rate (full fine-tuning)")
    parser.add_argument("--lag", type=int, default=4, help="version lag of both async arms")
    parser.add_argument("--sweep-lags", default="", help="comma-separated extra lags for ungated arms")
    parser.add_argument("--seeds", default="0",
                        help="comma-separated seeds (each runs every arm; --engine vllm: one real "
                             "loop run each, >= 3 for the learned test); empty with --merge: "
                             "only summarise the merged runs")
    parser.add_argument("--arms", default="sync,gated,ungated",
                        help="comma-separated subset of sync,gated,ungated to run (sync is always run: "
                             "the gaps are taken against it); the --sweep-lags arms are extra")
    parser.add_argument("--warmup-steps", type=int, default=300, help="supervised warm-up steps")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between evaluations")
    parser.add_argument("--eval-size", type=int, default=256, help="tasks in the eval set")
    parser.add_argument("--eval-metric", choices=("expected", "sampled"), default="expected",
                        help="the eval score the curves and the verdict use: expected = mean probability "
                        "of the correct completion (no sampling noise), sampled = one sample per task")
    parser.add_argument("--levels", default=None,
                        help="task levels, comma-separated (default 1 in-process, 1,2,3 with --engine vllm)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="completion token budget (default 12 in-process, 16 with vLLM)")
    parser.add_argument("--kl-coef", type=float, default=KL_COEF,
                        help="weight of the k3 KL to the warmed-up weights in every arm's loss "
                        "(0: none; see docs/learning.md for the choice)")
    parser.add_argument("--max-grad-norm", type=float, default=1.0,
                        help="global gradient-norm clip of every arm (0: none)")
    parser.add_argument("--tis-cap", type=float, default=2.0, help="token TIS cap C of the gated arm")
    parser.add_argument("--parallel", type=int, default=3, help="arms run at once (processes)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per arm")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/bench-learning-<time>)")
    parser.add_argument("--merge", type=Path, action="append", default=[],
                        help="an earlier bench-learning.json (same settings) whose arms join the "
                             "summaries and the across-seed aggregate (repeatable; arms of a seed "
                             "run now win)")
    parser.add_argument("--json", action="store_true", help="JSON only (the default output anyway)")
    real = parser.add_argument_group("--engine vllm (the real loop: rollbank train)")
    real.add_argument("--engine", choices=("inprocess", "vllm"), default="inprocess",
                      help="inprocess: the arms sample from the trainer's weights; vllm: one run "
                      "of the real loop (vLLM server, sandboxes, verifier, publication)")
    real.add_argument("--mode", choices=("sync", "async"), default="sync",
                      help="vllm: loop mode (async uses --lag as loop.max_lag)")
    real.add_argument("--publisher", choices=("direct", "checkpoint", "lora"), default="direct",
                      help="vllm: weight publication pattern (lora trains a LoRA adapter)")
    real.add_argument("--gated", action="store_true",
                      help="vllm: the divergence gate in collection + a correction in the loss "
                      "(--correction)")
    real.add_argument("--correction", choices=[m.value for m in CorrectionMode if m.value != "none"],
                      default="token_tis",
                      help="vllm --gated: the loss's staleness correction (rollbank.staleness."
                      "corrections; caps at their config defaults, token TIS's at --tis-cap)")
    real.add_argument("--pool-size", type=int, default=400,
                      help="vllm: distinct training tasks (task folders; none in the eval set)")
    real.add_argument("--eval-samples", type=int, default=4,
                      help="vllm: attempts per held-out eval task")
    real.add_argument("--sandbox-slots", type=int, default=12, help="vllm: sandboxes at once")
    real.add_argument("--vllm-compile", choices=("inductor", "eager"), default="inductor",
                      help="vllm: the managed server's compile mode (eager: --enforce-eager, no "
                      "compile, a faster start and slower decoding)")
    real.add_argument("--trainer-step-s", type=float, default=0.0,
                      help="vllm: an instrument: each trainer step lasts at least this long (the "
                      "real step, then a sleep; learning/paced_trainer.py), as a larger model's "
                      "trainer is slower than its collection: async mode's lag then builds up "
                      "(0: the real step's time)")
    real.add_argument("--compare", default="",
                      help="vllm: do not run; NAME=FILE,... of bench-learning-vllm-seeds.json "
                      "runs on the same seeds (e.g. sync=...,gated=...,ungated=...): per-sample "
                      "reward, policy age and gate decisions side by side, each against sync "
                      "(learning/real_arms.py)")
    real.add_argument("--report-only", action="store_true",
                      help="vllm: do not run; evaluate and report the run already in --out "
                      "(e.g. one that stopped with an error)")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _run_arm(spec_d: dict[str, Any], settings_d: dict[str, Any], model_dir: str) -> dict[str, Any]:
    """Worker-process entry: one arm (module-level so it pickles)."""
    import torch

    from rollbank_bench.learning.arm import ArmRunner, ArmSpec, Settings

    torch.set_num_threads(settings_d["threads"])

    def log(msg: str) -> None:
        print(f"[learning] {msg}", file=sys.stderr, flush=True)

    result = ArmRunner(ArmSpec(**spec_d), Settings(**settings_d), Path(model_dir), log).run()
    result["seed"] = settings_d["seed"]
    return result


def plan(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The arms (name, lag, gated) and the shared settings for ``args``."""
    steps = min(args.steps, 3) if args.quick else args.steps
    lag = min(args.lag, 1) if args.quick else args.lag
    wanted = {x.strip() for x in args.arms.split(",") if x.strip()} | {"sync"}
    unknown = wanted - {"sync", "gated", "ungated"}
    if unknown:
        raise ValueError(f"--arms: unknown arm(s) {sorted(unknown)} (choose from sync, gated, ungated)")
    arms = [a for a in ({"name": "sync", "lag": 0, "gated": False},
                        {"name": "gated", "lag": lag, "gated": True},
                        {"name": "ungated", "lag": lag, "gated": False}) if a["name"] in wanted]
    for extra in ([] if args.quick else _ints(args.sweep_lags)):
        if extra != lag and extra > 0:
            arms.append({"name": f"ungated-lag{extra}", "lag": extra, "gated": False})
    settings = {
        "steps": steps, "prompts": min(args.prompts, 4) if args.quick else args.prompts,
        "group_size": min(args.group_size, 4) if args.quick else args.group_size, "lr": args.lr,
        "max_new_tokens": 12 if args.max_new_tokens is None else args.max_new_tokens, "eval_every": 1 if args.quick else args.eval_every,
        "eval_size": min(args.eval_size, 16) if args.quick else args.eval_size, "threads": args.threads,
        "tis_cap": args.tis_cap, "levels": _ints(args.levels or "1"), "eval_metric": args.eval_metric,
        "kl_coef": args.kl_coef, "max_grad_norm": args.max_grad_norm,
    }
    return arms, settings


def lag_of(arms: list[dict[str, Any]]) -> int:
    """The async arms' lag (0 when only sync runs)."""
    return max((int(a["lag"]) for a in arms if a["name"] in ("gated", "ungated")), default=0)


_SAME = ("steps", "prompts", "group_size", "lr", "max_new_tokens", "eval_every", "eval_size",
         "tis_cap", "levels", "eval_metric", "kl_coef", "max_grad_norm")
# runs written before these settings existed
_LEGACY = {"levels": [1, 2, 3], "eval_metric": "sampled", "kl_coef": 0.0, "max_grad_norm": 1.0}


def merged_arms(paths: list[Path], settings: dict[str, Any], lag: int, warm: dict[str, Any],
                names: set[str], have: set[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Arms of earlier runs (``paths``) with the same settings, lag and warm-up, restricted to
    ``names`` and to (arm, seed) pairs not in ``have``; a settings mismatch is an error."""
    out: list[dict[str, Any]] = []
    for p in paths:
        doc = json.loads(p.read_text())
        old = doc["settings"]
        old = _LEGACY | old
        diff = {k: (old.get(k), settings[k]) for k in _SAME if old.get(k) != settings[k]}
        if old.get("lag") != lag:
            diff["lag"] = (old.get("lag"), lag)
        for k in ("base", "steps", "batch", "lr", "seed"):
            if doc["warmup"].get(k) != warm.get(k):
                diff[f"warmup.{k}"] = (doc["warmup"].get(k), warm.get(k))
        if diff:
            raise ValueError(f"--merge {p}: settings differ (old, now): {diff}")
        for a in doc["arms"]:
            key = (a["arm"], a.get("seed"))
            if a["arm"] in names and key not in have:
                out.append(a)
                have.add(key)
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from rollbank_bench.learning.aggregate import aggregate
    from rollbank_bench.learning.report import arm_summary, verdict, write_mean_plot, write_plots
    from rollbank_bench.learning.warmup import warm_up

    out = args.out or Path("runs") / time.strftime("bench-learning-%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    warm_steps = min(args.warmup_steps, 20) if args.quick else args.warmup_steps
    model_dir, warm = warm_up(steps=warm_steps, log=lambda m: print(f"[learning] {m}", file=sys.stderr))
    arms, settings = plan(args)
    seeds = _ints(args.seeds)  # none: only the --merge runs are summarised
    if not seeds and not args.merge:
        raise ValueError("--seeds is empty and nothing to --merge")
    jobs = [(arm, settings | {"seed": seed}) for seed in seeds for arm in arms]
    prior = merged_arms(list(args.merge), settings, lag_of(arms), warm, {a["name"] for a in arms},
                        {(a["name"], s["seed"]) for a, s in jobs})
    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    if args.parallel > 1:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=args.parallel, mp_context=ctx) as pool:
            futures = [pool.submit(_run_arm, a, s, str(model_dir)) for a, s in jobs]
            results = [f.result() for f in futures]
    else:
        results = [_run_arm(a, s, str(model_dir)) for a, s in jobs]
    seconds = time.perf_counter() - t0
    results += prior
    summaries = []
    for r in results:
        sync = next(x for x in results if x["arm"] == "sync" and x["seed"] == r["seed"])
        summaries.append(arm_summary(r, None if r is sync else sync))
    doc: dict[str, Any] = {
        "bench": "learning", "quick": bool(args.quick), "model": "tiny (warmed up)",
        "sampler": "in-process (trainer weights, HF generate); see docs/learning.md",
        "task_family": "graded addition, action 'echo N > answer.txt', verified in-process",
        "settings": settings | {"seeds": sorted({r["seed"] for r in results}), "seeds_run": seeds,
                                "lag": lag_of(arms)},
        "warmup": warm, "warmup_dir": str(model_dir),
        "seconds": seconds, "merged_from": [str(p) for p in args.merge],
        "load_average_1m": {"before": load_before, "after": os.getloadavg()[0]},
        "summaries": summaries, "verdict": verdict(summaries),
        "across_seeds": aggregate(results), "arms": results,
    }
    doc["plots"] = write_plots(results, out) + write_mean_plot(doc["across_seeds"], out)
    (out / "bench-learning.json").write_text(json.dumps(doc, indent=2))
    doc["out"] = str(out)
    return doc


def vllm_args(args: argparse.Namespace) -> argparse.Namespace:
    """``--engine vllm``: its defaults, the run's seed (the first of ``--seeds``) and the
    ``--quick`` sizes (at most 2 sync steps of 2 groups x 4, 16 eval tasks, 1 sample each,
    a 16-task pool and a 20-step warm-up; smaller explicit sizes win)."""
    args.seed = (_ints(args.seeds) or [0])[0]
    if args.max_new_tokens is None:
        args.max_new_tokens = 16
    if args.levels is None:
        args.levels = "1,2,3"
    if args.quick:
        args.steps, args.prompts = min(args.steps, 2), min(args.prompts, 2)
        args.group_size, args.eval_size = min(args.group_size, 4), min(args.eval_size, 16)
        args.eval_samples, args.pool_size = min(args.eval_samples, 1), min(args.pool_size, 16)
        args.eval_every, args.warmup_steps = 1, min(args.warmup_steps, 20)
    return args


def run(args: argparse.Namespace) -> int:
    if args.compare:
        from rollbank_bench.learning.real_arms import compare_files, plot

        doc = compare_files(args.compare)
        if args.out is not None:  # the document and its figure there
            args.out.mkdir(parents=True, exist_ok=True)
            doc["plot"] = plot(doc, args.out / "learning_arms.png")
            (args.out / "bench-learning-vllm-compare.json").write_text(json.dumps(doc, indent=2))
        print(json.dumps(doc, indent=2))
        return 0
    if args.engine == "vllm":
        seeds = _ints(args.seeds) or [0]
        if len(seeds) > 1:  # one real-loop run per seed, then the across-seed test
            from rollbank_bench.learning.real_seeds import measure_seeds

            doc = measure_seeds(vllm_args(args), seeds)
            print(json.dumps({k: v for k, v in doc.items() if k != "runs"}, indent=2))
            return 0
        from rollbank_bench.learning.real_loop import measure_vllm

        doc = measure_vllm(vllm_args(args))
        print(json.dumps({k: v for k, v in doc.items() if k not in ("steps", "batches")}, indent=2))
        return 0
    doc = measure(args)
    print(json.dumps({k: v for k, v in doc.items() if k != "arms"}, indent=2))
    return 0
