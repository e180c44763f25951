"""``rollbank bench learning --engine vllm``: the learning experiment through the real loop.

The in-process bench (:mod:`rollbank_bench.learning.arm`) samples from the trainer's own
weights. This runs the same task family and the same warmed-up tiny model through
``rollbank train`` instead (:func:`rollbank.training.loop_run.run_train`): a managed vLLM CPU
server serves the warmed model, the collector runs every attempt in a real bubblewrap sandbox
(the answer-line harness: the prompt ``Q: 13+7=? A:`` as it is, the one completion run as the
command), the task's ``tests/test.sh`` verifies ``/app/answer.txt``, the built-in trainer
steps on each written Parquet batch and the publisher (``direct`` by default) installs the new
version in the running server, which tags the tokens it generates with it.

Held-out evaluation: the bench's in-process evaluator (HF ``generate`` from a weights folder,
:func:`~rollbank_bench.learning.policy.sample`, exact-format verifier) on a fixed task set
that the training pool excludes, for the warmed start (version 0) and for the saved versions
``weights/vNNNNNN`` every ``--eval-every`` steps and the last. Same seed for every version.
The same evaluation on as many tasks of the training pool (``train_evals``) separates
learning the trained tasks from generalising to unseen ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollbank_bench.learning.tasks import AdditionTask, eval_tasks, sample_task

if TYPE_CHECKING:
    from rollbank.training.loop_run import StepTrainer

EVAL_SEED = 10_000_019


def held_out_split(levels: tuple[int, ...], eval_size: int, pool_size: int,
                   seed: int) -> tuple[list[AdditionTask], list[AdditionTask]]:
    """(eval tasks, training pool): the eval set is the bench's fixed ``eval_tasks`` (distinct
    tasks only); the pool is up to ``pool_size`` distinct tasks of the same levels drawn from
    the seed's own stream, none of them in the eval set."""
    from rollbank_bench.learning.task_folders import folder_name, unique

    held = unique(eval_tasks(eval_size, levels))
    seen = {folder_name(t) for t in held}
    rng = random.Random(f"learning/vllm/{seed}")
    pool: list[AdditionTask] = []
    for _ in range(pool_size * 50):
        if len(pool) >= pool_size:
            break
        t = sample_task(rng, levels)
        if folder_name(t) not in seen:
            seen.add(folder_name(t))
            pool.append(t)
    return held, pool


def loop_overrides(args: argparse.Namespace, model_dir: Path, suite: Path, out: Path
                   ) -> dict[str, Any]:
    """The dotted ``rollbank train`` overrides this bench runs with (see docs/learning.md)."""
    o: dict[str, Any] = {
        "trainer.model": str(model_dir), "collect.inference.managed.model": str(model_dir),
        "trainer.finetune": "lora" if args.publisher == "lora" else "full",
        "trainer.lr": args.lr, "trainer.temperature": 1.0, "trainer.max_grad_norm": 1.0,
        # the same k3 anchor to the warmed-up weights as the in-process arms (--kl-coef; it was
        # ignored here: without it seed 0 of a 30-step run collapsed to reward 0 at step 7)
        "trainer.kl_coef": args.kl_coef,
        "trainer.micro_batch_size": args.prompts * args.group_size,
        "collect.tasks": [str(suite)], "collect.include": [], "collect.output": str(out),
        "collect.task_order_seed": args.seed,
        "collect.harness": "answer-line",
        "collect.answer_line.max_tokens": args.max_new_tokens,
        "collect.answer_line.temperature": 1.0,
        "collect.runner.max_turns": 1, "collect.runner.max_model_len": 64,
        "collect.runner.step_timeout_s": 20.0, "collect.runner.episode_budget_s": 60.0,
        "collect.inference.managed.max_model_len": 64,
        "collect.inference.managed.compile": args.vllm_compile,
        "collect.scheduler.groups_per_batch": args.prompts,
        "collect.scheduler.pool_groups": args.prompts,
        "collect.scheduler.bank.group_size": args.group_size,
        "collect.scheduler.sandbox_slots": args.sandbox_slots,
        "collect.scheduler.inference_slots_per_server": max(args.sandbox_slots, 8),
        "collect.scheduler.seed": args.seed,
        "collect.metrics.record_episodes": False,
        "loop.steps": args.steps, "loop.mode": args.mode, "loop.publisher": args.publisher,
    }
    if args.mode == "async":
        o["loop.max_lag"] = args.lag
        # explicit: `rollbank train` turns the gate on by default in async; --gated decides here
        o["collect.staleness.collection.enabled"] = bool(args.gated)
    if args.gated:  # the divergence gate in collection + a correction (token TIS) in the loss
        o.update({"collect.staleness.collection.enabled": True,
                  "trainer.correction.mode": getattr(args, "correction", "token_tis"),
                  "trainer.correction.tis_cap": args.tis_cap,
                  "trainer.ratio_against": "recompute"})
    if args.publisher == "lora":
        o["loop.inflight"] = "finish"
    return o


def paced(args: argparse.Namespace) -> Callable[[StepTrainer], StepTrainer] | None:
    """``--trainer-step-s``: the trainer wrapped in the pacing instrument, else none."""
    step_s = float(getattr(args, "trainer_step_s", 0.0) or 0.0)
    if step_s <= 0:
        return None
    from rollbank_bench.learning.paced_trainer import PacedTrainer

    return lambda inner: PacedTrainer(inner, step_s)


def batch_versions(out: Path) -> list[dict[str, Any]]:
    """Per written batch: its index, rows, reward mean and the per-token versions it holds."""
    import pyarrow.parquet as pq

    rows = []
    for d in sorted((out / "batches").glob("batch-*")):
        t = pq.read_table(d / "trajectories.parquet",
                          columns=["reward", "min_version", "max_version", "policy_versions"])
        counts: dict[str, int] = {}
        for seq in t.column("policy_versions").to_pylist():
            for v in seq:
                if v >= 0:
                    counts[str(v)] = counts.get(str(v), 0) + 1
        rewards = t.column("reward").to_pylist()
        rows.append({"batch": d.name, "trajectories": t.num_rows,
                     "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
                     "min_version": min(t.column("min_version").to_pylist(), default=None),
                     "max_version": max(t.column("max_version").to_pylist(), default=None),
                     "token_versions": counts})
    return rows


def load_policy(model_dir: Path) -> tuple[Any, Any]:
    """(model, codec) of the weights folder ``model_dir``, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    from rollbank_bench.learning.policy import TextCodec

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.train(False)
    return model, TextCodec(model_dir)


def evaluate(model_dir: Path, tasks: Sequence[AdditionTask], samples: int,
             max_new_tokens: int, version: int, loaded: tuple[Any, Any] | None = None
             ) -> dict[str, Any]:
    """Solve rate of the weights in ``model_dir`` on ``tasks`` (``samples`` attempts each);
    ``loaded``: that folder's :func:`load_policy`, when the caller already has it."""
    from rollbank_bench.learning.policy import sample

    model, codec = loaded if loaded is not None else load_policy(model_dir)
    todo = [t for t in tasks for _ in range(samples)]
    got = []
    for k in range(0, len(todo), 128):
        got += sample(model, codec, todo[k:k + 128], version=version, seed=EVAL_SEED + k,
                      max_new_tokens=max_new_tokens)
    by: dict[int, list[float]] = {}
    for x in got:
        by.setdefault(x.task.level, []).append(x.reward)
    return {"version": version, "weights": str(model_dir), "attempts": len(got),
            "solve_rate": sum(x.reward for x in got) / len(got),
            "by_level": {str(k): sum(v) / len(v) for k, v in sorted(by.items())}}


def plot(doc: dict[str, Any], path: Path) -> str:
    from rollbank.metrics.report import plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    steps = doc["steps"]
    ax[0].plot([s["version"] for s in steps], [s["reward_mean"] for s in steps], marker="o", ms=3,
               label="train reward (batch mean)")
    ax[0].plot([e["version"] for e in doc["evals"]], [e["solve_rate"] for e in doc["evals"]],
               marker="s", label="held-out eval solve rate")
    ax[0].plot([e["version"] for e in doc["train_evals"]],
               [e["solve_rate"] for e in doc["train_evals"]], marker="^",
               label="eval on training-pool tasks")
    ax[0].set(xlabel="version (optimizer steps)", ylabel="reward",
              title=f"real loop: vLLM + sandboxes, {doc['settings']['mode']}, "
                    f"{doc['settings']['publisher']}")
    ax[0].legend(fontsize=8)
    ax[1].plot([s["version"] for s in steps], [s["policy_age"] for s in steps], marker="o", ms=3,
               label="policy age of the trained batch")
    ax[1].plot([s["version"] for s in steps], [s.get("publication_s") or 0 for s in steps],
               label="publication s")
    ax[1].set(xlabel="version", title="freshness and publication")
    ax[1].legend(fontsize=8)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path.name


def steps_from_run(train_dir: Path) -> tuple[list[dict[str, Any]], int, int, int]:
    """Per-step records of a run folder's ``train.jsonl`` (publication latency and pause joined
    by version), the trainer's and the served version, and the stale batches dropped. Read
    from the file, not the loop's summary, so a run that stopped with an error is reported."""
    records = [json.loads(line) for line in (train_dir / "train.jsonl").read_text().splitlines()
               if line.strip()]
    pubs = {r["version"]: r for r in records if r.get("kind") == "publication"}
    keys = ("version", "batch_index", "reward_mean", "loss", "policy_age", "versions",
            "trajectories", "train_s", "step_s", "done_s", "gate")
    steps = []
    for r in records:
        if r.get("kind") == "step":
            p = pubs.get(r["version"], {})
            steps.append({k: r.get(k) for k in keys} | {
                "publication_s": p.get("publication_s"), "apply_pause_s": p.get("apply_pause_s")})
    final = max((s["version"] for s in steps), default=0)
    return steps, final, max(pubs, default=0), sum(r.get("kind") == "stale" for r in records)


def measure_vllm(args: argparse.Namespace) -> dict[str, Any]:
    """Run the loop (unless ``--report-only``), evaluate the saved versions, write the JSON."""
    from rollbank.config import cache_dir
    from rollbank.training.loop_config import load_train_config
    from rollbank.training.loop_run import run_train
    from rollbank_bench.learning.task_folders import write_suite
    from rollbank_bench.learning.warmup import warm_up

    def log(msg: str) -> None:
        print(f"[learning-vllm] {msg}", file=sys.stderr, flush=True)

    out = args.out or Path("runs") / time.strftime("bench-learning-vllm-%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    model_dir, warm = warm_up(steps=args.warmup_steps, log=log)
    levels = tuple(int(x) for x in args.levels.split(","))
    held, pool = held_out_split(levels, args.eval_size, args.pool_size, args.seed)
    suite = write_suite(cache_dir() / "learning" / "suites", "train", pool)
    load_before = os.getloadavg()
    wrap = paced(args)
    run_s: float | None = None
    error: str | None = None
    if not args.report_only:
        config = load_train_config(None, loop_overrides(args, model_dir, suite, out / "train"))
        t0 = time.perf_counter()
        try:
            asyncio.run(run_train(config, progress=log, wrap_trainer=wrap))
        except Exception as exc:  # the run stopped: report what it did, with the error
            error = f"{type(exc).__name__}: {exc}"
            log(f"the loop stopped: {error}")
        run_s = time.perf_counter() - t0
    elif (out / "bench-learning-vllm.json").exists():  # re-evaluated: the run's own wall and error
        earlier = json.loads((out / "bench-learning-vllm.json").read_text())
        run_s, error = earlier.get("run_seconds"), earlier.get("error")
    steps, final, served, stale = steps_from_run(out / "train")
    eval_versions = sorted({0, final, *range(args.eval_every, final + 1, args.eval_every)})
    trained = pool[: len(held)]  # in-distribution: tasks of the training pool, as many as held out
    evals, train_evals = [], []
    for v in eval_versions:
        wdir = model_dir if v == 0 else out / "train" / "weights" / f"v{v:06d}"
        loaded = load_policy(wdir)  # once per version, for both sets
        evals.append(evaluate(wdir, held, args.eval_samples, args.max_new_tokens, v, loaded))
        train_evals.append(evaluate(wdir, trained, args.eval_samples, args.max_new_tokens, v,
                                    loaded))
        log(f"eval v{v}: held-out {evals[-1]['solve_rate']:.3f} {evals[-1]['by_level']}, "
            f"training tasks {train_evals[-1]['solve_rate']:.3f}")
    rewards = [s["reward_mean"] for s in steps]
    half = len(rewards) // 2
    doc: dict[str, Any] = {
        "bench": "learning", "engine": "vllm (managed CPU server) + bwrap sandboxes + test.sh"
                  + (f"; trainer paced to >= {args.trainer_step_s:g} s a step (instrument: "
                     "learning/paced_trainer.py)" if wrap is not None else ""),
        "model": "tiny (warmed up)", "warmup": warm, "warmup_dir": str(model_dir),
        "task_family": f"graded addition levels {list(levels)}, answer-line harness, "
                       "verified by the task's tests/test.sh in the sandbox",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                     if k not in ("func",)},
        "train_pool": len(pool), "eval_tasks": len(held), "error": error,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "run_seconds": run_s, "final_version": final, "served_version": served,
        "stale_batches": stale, "steps": steps,
        "batches": batch_versions(out / "train"), "evals": evals, "train_evals": train_evals,
        "summary": {
            "train_reward_first_half": sum(rewards[:half]) / half if half else None,
            "train_reward_second_half": (sum(rewards[half:]) / (len(rewards) - half)
                                         if len(rewards) > half else None),
            "eval_start": evals[0]["solve_rate"], "eval_final": evals[-1]["solve_rate"],
            "eval_start_by_level": evals[0]["by_level"], "eval_final_by_level": evals[-1]["by_level"],
            "train_tasks_eval_start": train_evals[0]["solve_rate"],
            "train_tasks_eval_final": train_evals[-1]["solve_rate"],
        },
        "out": str(out),
    }
    doc["plot"] = plot(doc, out / "reward_vs_version.png")
    (out / "bench-learning-vllm.json").write_text(json.dumps(doc, indent=2, default=str))
    return doc
