"""The simulated world of ``bench schedule``: the trace workload, the capacity (servers and
latency profile), each attempt's simulated episode under ``--model``, the scheduler's
configuration per arm, and the tasks — shared by the sweep (:mod:`rollbank_bench.schedule`)
and the scale run (:mod:`rollbank_bench.schedule_scale`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rollbank_bench.collect import trace_overrides

if TYPE_CHECKING:
    from collections.abc import Callable

    from rollbank.episodes.workload import TraceWorkload
    from rollbank.scheduling.config import SchedulerConfig
    from rollbank.scheduling.policy.types import AttemptSpec
    from rollbank.scheduling.sim.sim_model import SimCapacity
    from rollbank.scheduling.sim.simulate import SimEpisode


def workload(args: argparse.Namespace, seed: int) -> TraceWorkload:
    from rollbank.episodes.workload import TraceWorkload, WorkloadConfig

    o: dict[str, Any] = {**trace_overrides(args), "kind": "trace", "seed": seed}
    return TraceWorkload(WorkloadConfig.model_validate(o))


def capacity(args: argparse.Namespace) -> SimCapacity:
    from rollbank.scheduling.sim.sim_model import LatencyProfile, SimCapacity

    profile = LatencyProfile("bench", args.prefill_s_per_token, args.decode_s_per_token,
                             args.decode_batch_slope)
    return SimCapacity(args.servers, profile, prefix_cache=not args.no_prefix_cache)


def episode_fn(args: argparse.Namespace, seed: int,
               memo: dict[int, SimEpisode] | None = None) -> Callable[[AttemptSpec], SimEpisode]:
    """The simulated episode of an attempt: its trace plan under ``--model``. ``memo``
    (durations model) keeps each attempt seed's episode, so a second arm on the same
    seeds reuses the first arm's plans (an attempt seed is unique per (seq, slot))."""
    from rollbank.scheduling.sim.sim_model import SimTurn
    from rollbank.scheduling.sim.simulate import SimEpisode

    w = workload(args, seed)

    def durations(spec: AttemptSpec) -> SimEpisode:
        ep = memo.get(spec.seed) if memo is not None else None
        if ep is None:  # the plan's values without its objects: the same floats, summed alike
            rate, ttft = args.decode_rate, args.ttft_s
            ep = SimEpisode(args.overhead_s + sum([tokens / rate + ttft + tool for tokens, tool, _
                                                   in w.turn_values(spec.task_id, spec.seed)]))
            if memo is not None:
                memo[spec.seed] = ep
        return ep

    def contention(spec: AttemptSpec) -> SimEpisode:
        plan = w.plan(spec.task_id, spec.seed)
        turns = tuple(SimTurn(args.obs_tokens if k else args.prompt_tokens, t.tokens, t.tool_s)
                      for k, t in enumerate(plan.turns))
        return SimEpisode(args.start_s, turns=turns, verify_s=args.verify_s)

    return contention if args.model == "contention" else durations


def scheduler_config(args: argparse.Namespace, seed: int, *, naive: bool, slots: int,
                     pool: int) -> SchedulerConfig:
    from rollbank.scheduling.config import (
        ReadyBankConfig,
        SchedulerConfig,
        SchedulingMode,
        StragglerPolicy,
    )

    contention = args.model == "contention"
    return SchedulerConfig(
        mode=SchedulingMode.NAIVE if naive else SchedulingMode.OPTIMIZED,
        groups_per_batch=args.groups, pool_groups=args.groups if naive else pool,
        straggler=StragglerPolicy.WAIT if naive else StragglerPolicy(args.straggler),
        sandbox_slots=slots, num_batches=args.batches, seed=seed,
        inference_slots_per_server=args.inference_slots if contention else 16,
        verifier_slots=(args.verifier_slots or None) if contention else None,
        bank=ReadyBankConfig(group_size=args.group_size),
    )


def load_tasks(args: argparse.Namespace) -> list[Any]:
    from rollbank.collect_config import load_collect_config
    from rollbank.task_selection import select_tasks
    from rollbank_bench.collect_args import DEFAULT_TASKS

    sets: dict[str, Any] = {"tasks": args.tasks, "exclude_costs": [
        c for c in args.exclude_costs.split(",") if c]}
    if list(args.tasks) == DEFAULT_TASKS:  # as bench collect: the embedded default's selection
        sets["include"] = list(load_collect_config(None, {}).include)
    return list(select_tasks(load_collect_config(None, sets)))


def model_description(args: argparse.Namespace) -> dict[str, Any]:
    if args.model == "durations":
        return {"model": "durations", "decode_rate": args.decode_rate, "ttft_s": args.ttft_s,
                "overhead_s": args.overhead_s}
    cap = capacity(args)
    return {"model": "contention", "start_s": args.start_s, "verify_s": args.verify_s,
            "verifier_slots": args.verifier_slots or None, "servers": cap.servers,
            "inference_slots_per_server": args.inference_slots,
            "prompt_tokens": args.prompt_tokens, "obs_tokens": args.obs_tokens,
            "prefix_cache": cap.prefix_cache, "profile": vars(cap.profile)}
