"""The real policy in virtual time on a seeded long-tail workload: naive vs optimized."""

from __future__ import annotations

import math
import random

from rollbank.episodes.outcome import Reason
from rollbank.scheduling.config import (
    ReadyBankConfig,
    SchedulerConfig,
    SchedulingMode,
    StragglerPolicy,
)
from rollbank.scheduling.policy.types import AttemptSpec
from rollbank.scheduling.sim.simulate import SimEpisode, simulate

TASKS = [f"task-{i}" for i in range(16)]


def workload(spec: AttemptSpec) -> SimEpisode:
    """Heavy-tailed durations fixed by (seed, retry); 5% infra failures; reward by duration."""
    rng = random.Random(spec.seed * 7 + spec.retry)
    task_scale = 1.0 + (int(spec.task_id.split("-")[1]) % 4)  # some tasks are slower
    duration = task_scale * math.exp(rng.gauss(0.0, 1.0))
    if rng.random() < 0.05:
        return SimEpisode(duration / 2, Reason.SANDBOX_DIED, None)
    passed = rng.random() < 0.5
    return SimEpisode(duration, Reason.VERIFIED_PASS if passed else Reason.VERIFIED_FAIL,
                      float(passed))


def _config(**kw: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "groups_per_batch": 8, "pool_groups": 10, "sandbox_slots": 32, "num_batches": 6,
        "bank": ReadyBankConfig(group_size=4, max_retries=2, min_valid=2),
    }
    return SchedulerConfig(**(base | kw))  # type: ignore[arg-type]


def test_optimized_collector_beats_naive_on_the_same_workload_and_capacity() -> None:
    naive = simulate(_config(mode=SchedulingMode.NAIVE), TASKS, workload)
    carry = simulate(_config(straggler=StragglerPolicy.CARRY), TASKS, workload)
    assert len(naive.batches) == len(carry.batches) == 6
    assert all(b.complete for b in carry.batches)
    # naive loses infra-failed siblings (no in-slot re-run); optimized re-runs them
    assert sum(len(b.trajectories) for b in naive.batches) < 6 * 8 * 4
    assert sum(len(b.trajectories) for b in carry.batches) == 6 * 8 * 4
    assert carry.retried > 0 and naive.retried == 0
    # over the whole multi-batch window, counting the surplus left at close as waste
    assert carry.end_s < naive.end_s
    for r in (naive, carry):
        assert r.consumed + r.retried + r.waste == r.launched


def test_abort_policy_wastes_work_and_the_profile_shows_the_short_first_bias() -> None:
    abort = simulate(_config(straggler=StragglerPolicy.ABORT), TASKS, workload)
    assert abort.consumed + abort.retried + abort.waste == abort.launched
    aborted = sum(b.accounting.waste_by_reason.get("aborted", 0) for b in abort.batches)
    assert aborted > 0
    last = abort.batches[-1].profile
    assert last.accepted_duration.mean < last.pool_duration.mean


def test_wait_policy_emits_complete_batches_without_aborting() -> None:
    wait = simulate(_config(straggler=StragglerPolicy.WAIT), TASKS, workload)
    assert all(b.complete for b in wait.batches)
    assert not any(b.accounting.waste_by_reason.get("aborted") for b in wait.batches)
