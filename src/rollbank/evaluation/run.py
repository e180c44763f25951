"""``rollbank eval``: a task suite on the engine, precision and weights that will serve.

Reuses the collector (:func:`rollbank.collector.collect`) with scheduling that counts every
attempt: one group per task (``groups_per_batch = pool_groups = max_groups`` = the number of
tasks: no over-provisioning), ``attempts`` siblings per group, ``straggler = wait`` (no
first-finished selection: the batch waits for every attempt), no slot re-runs
(``max_retries = 0``: an infra failure is recorded as that attempt's outcome) and no group
dropped for lack of variance or of valid siblings. Each model or checkpoint of a sweep runs
in turn against its own servers, into ``<output>/<label>/`` (the collector's folder layout:
episodes, events, summary, report; no training batch is written), and gives one row of
``<output>/eval.json`` and one line per task of ``<output>/results.jsonl`` (its solve rate).
Progress lines name tasks solved (:mod:`rollbank.evaluation.progress`), not batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from rollbank.collect_config import CollectConfig
from rollbank.collector import check_output_folder, collect, enter_concurrently, plain_printer
from rollbank.config import Section
from rollbank.episodes.sources import SandboxPlane
from rollbank.errors import ConfigError
from rollbank.evaluation.progress import EvalProgress
from rollbank.evaluation.scoring import score
from rollbank.evaluation.timing import (
    TimingClient,
    bucket_delta,
    merge_buckets,
    scrape_text,
    ttft_buckets,
)
from rollbank.inference.protocol import InferenceClient
from rollbank.inference_plane import InferencePlane, open_inference
from rollbank.scheduling.config import DynamicSamplingConfig, SchedulingMode, StragglerPolicy
from rollbank.task_selection import select_tasks
from rollbank.tasks.model import Task

Scrape = Callable[[str], Awaitable[str | None]]


class EvalOptions(Section):
    """What ``rollbank eval`` adds to a collect configuration."""

    attempts: int = Field(default=4, ge=1, description="attempts per task (n of pass@k), all counted")
    ks: list[int] = Field(default_factory=list, description="k values of pass@k (empty: 1 and attempts)")
    models: list[str] = Field(
        default_factory=list, description="models or checkpoint folders to evaluate side by side, one "
        "row each (managed servers); empty: the config's model")
    output: str = Field(default="runs/eval", description="output folder (eval.json, one folder per model)")

    @model_validator(mode="after")
    def _ks_fit(self) -> EvalOptions:
        bad = [k for k in self.ks if not 1 <= k <= self.attempts]
        if bad:
            raise ValueError(f"ks {bad} must be between 1 and attempts ({self.attempts})")
        return self

    def k_values(self) -> list[int]:
        return sorted(set(self.ks or [1, self.attempts]))


def eval_config(config: CollectConfig, *, attempts: int, num_tasks: int,
                model: str | None = None) -> CollectConfig:
    """``config`` with the scheduling that counts every attempt (see the module doc)."""
    sched = config.scheduler
    bank = sched.bank.model_copy(update={
        "group_size": attempts, "max_retries": 0, "min_valid": 1, "filter_zero_variance": False,
        "dynamic_sampling": DynamicSamplingConfig()})  # every group counts, none held back
    sched = sched.model_copy(update={
        "mode": SchedulingMode.OPTIMIZED, "groups_per_batch": num_tasks, "pool_groups": num_tasks,
        "max_groups": num_tasks, "num_batches": 1, "straggler": StragglerPolicy.WAIT,
        "requeue_aborted": False, "bank": bank})
    inference = config.inference.model_copy(update={"calibrate": False})
    if model is not None:
        if config.inference.kind != "managed":
            raise ConfigError(f"sweeping models needs managed servers (inference.kind is "
                              f"{config.inference.kind!r})", field="inference.kind")
        inference = inference.model_copy(update={
            "managed": inference.managed.model_copy(update={"model": model})})
    return config.model_copy(update={"scheduler": sched, "inference": inference,
                                     "task_order_seed": None})


def label_of(model: str) -> str:
    """A folder name for a model or checkpoint path."""
    name = Path(model).name if "/" in model else model
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"


def _precision(config: CollectConfig) -> str | None:
    if config.inference.kind != "managed":
        return None
    return config.inference.managed.plan().dtype or "model-config"


async def evaluate(config: CollectConfig, *, tasks: Sequence[Task], inference: InferencePlane,
                   sandboxes: SandboxPlane, out_dir: Path, ks: Sequence[int],
                   scrape: Scrape | None = None, setup_s: float = 0.0,
                   label: str = "model") -> dict[str, Any]:
    """One evaluation with opened planes; returns its row (also written as ``eval-row.json``).

    Writes no training batch; prints :class:`EvalProgress` lines on stderr unless
    ``metrics.live`` is ``off`` (the collector's batch view is always off here)."""
    timed = {url: TimingClient(c) for url, c in inference.clients.items()}
    plane = InferencePlane(dict[str, InferenceClient](timed), inference.tokenizer,
                           inference.vocab_size, inference.description)
    before = {u: ttft_buckets(t) for u in timed if scrape and (t := await scrape(u))}
    t0 = time.monotonic()
    quiet = config.model_copy(update={"metrics": config.metrics.model_copy(update={"live": "off"})})
    progress = [] if config.metrics.live == "off" else [EvalProgress(
        label=label, tasks=len(tasks), attempts=config.scheduler.bank.group_size)]
    result = await collect(quiet, tasks=tasks, inference=plane, sandboxes=sandboxes, out_dir=out_dir,
                           setup_s=setup_s, extra_sinks=progress, write_batches=False)
    wall = time.monotonic() - t0
    hist = None
    if scrape is not None:
        deltas = [bucket_delta(before.get(u, {}), ttft_buckets(t)) for u in timed
                  if (t := await scrape(u))]
        hist = merge_buckets(deltas) if deltas else None
    timings = [t for c in timed.values() for t in c.timings]
    row = score(result.trajectories, timings, ks=ks, engine_histogram=hist)
    row.update(
        model=config.inference.managed.model if config.inference.kind == "managed"
        else (config.inference.tokenizer or config.inference.kind),
        inference=inference.description, precision=_precision(config),
        weight_versions=sorted({c.policy_version for c in inference.clients.values()}),
        attempts_per_task=config.scheduler.bank.group_size,
        launched=result.ledger.get("launched"), wall_s=wall, setup_s=setup_s, output=str(out_dir))
    (out_dir / "eval-row.json").write_text(json.dumps(row, indent=2, default=str) + "\n")
    return row


async def _vllm_scrape(url: str) -> str | None:
    return await scrape_text(url)


async def run_eval_one(config: CollectConfig, out_dir: Path, ks: Sequence[int],
                       label: str = "model") -> dict[str, Any]:
    """Open the planes ``config`` describes, evaluate, release everything."""
    from rollbank.episodes.sandboxes import open_sandboxes

    check_output_folder(out_dir)
    tasks = select_tasks(config)
    say = plain_printer(config)
    t_setup = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        plane, sandboxes = await enter_concurrently(
            stack, open_inference(config.inference, max_model_len=config.runner.max_model_len, say=say),
            open_sandboxes(config.sandbox, tasks, prepare=tasks))
        scrape = None if config.inference.kind == "fake" else _vllm_scrape
        return await evaluate(config, tasks=tasks, inference=plane, sandboxes=sandboxes,
                              out_dir=out_dir, ks=ks, scrape=scrape,
                              setup_s=time.monotonic() - t_setup, label=label)


def run_eval(config: CollectConfig, options: EvalOptions) -> dict[str, Any]:
    """Every model of the sweep in turn; writes ``eval.json`` and ``results.jsonl``, returns
    ``{"rows": [...], ...}``."""
    out = Path(options.output)
    num_tasks = len(select_tasks(config))
    models: list[str | None] = list(options.models) or [None]
    rows = []
    for m in models:
        cfg = eval_config(config, attempts=options.attempts, num_tasks=num_tasks, model=m)
        label = label_of(m if m is not None else _model_name(cfg))
        rows.append(asyncio.run(run_eval_one(cfg, out / label, options.k_values(), label)))
    doc = {"ks": options.k_values(), "attempts_per_task": options.attempts, "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in result_lines(doc)))
    return doc


def result_lines(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per model and task: attempts, successes, solve rate (``results.jsonl``)."""
    return [{"model": str(row["model"]), "task": task, **counts}
            for row in doc["rows"] for task, counts in row["per_task"].items()]


def _model_name(cfg: CollectConfig) -> str:
    if cfg.inference.kind == "managed":
        return cfg.inference.managed.model
    return cfg.inference.kind


def table(doc: dict[str, Any]) -> str:
    """A short fixed-width table of the rows."""
    ks = doc["ks"]
    head = ["model", "prec", "ver", "tasks", "n", *[f"pass@{k}" for k in ks], "ok/infra",
            "ttft p50/p95/p99 s", "tok/s p50", "eng-s/succ", "sbx-s/succ"]
    lines = [head]
    for r in doc["rows"]:
        tt = r["ttft_s"]
        oc = r["outcomes"]
        lines.append([
            label_of(str(r["model"])), str(r["precision"] or "-"),
            ",".join(map(str, r["weight_versions"])), str(r["tasks"]), str(r["attempts"]),
            *[_f(r["pass_at"][str(k)]) for k in ks],
            f"{oc.get('model_success', 0)}/{oc.get('infra_failure', 0)}",
            "/".join(_f(tt[p]) for p in ("p50", "p95", "p99")) + (" (<=)" if tt["source"] ==
                                                                   "client_round_trip" else ""),
            _f(r["tokens_per_s"]["p50"], ".1f"), _f(r["engine_s_per_success"], ".1f"),
            _f(r["sandbox_s_per_success"], ".1f")])
    width = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, width, strict=True)) for row in lines)


def _f(x: float | None, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)
