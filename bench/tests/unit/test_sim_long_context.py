"""The simulator's long-context model: decode slowed by the KV in service, KV-capped admission."""

from __future__ import annotations

import pytest

from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig, StragglerPolicy
from rollbank.scheduling.policy.types import AttemptSpec
from rollbank.scheduling.sim.sim_model import LatencyProfile, SimCapacity, SimTurn
from rollbank.scheduling.sim.simulate import SimEpisode, simulate


def _run(profile: LatencyProfile, *, n: int = 2, prompt: int = 100,
         straggler: StragglerPolicy = StragglerPolicy.CARRY, pool: int = 1) -> float:
    cfg = SchedulerConfig(groups_per_batch=1, pool_groups=pool, sandbox_slots=8, num_batches=1,
                          straggler=straggler, inference_slots_per_server=8,
                          bank=ReadyBankConfig(group_size=n, max_retries=0, min_valid=1))

    def ep(spec: AttemptSpec) -> SimEpisode:
        return SimEpisode(0.0, turns=(SimTurn(prompt, 10, 0.0),))

    return simulate(cfg, ["t"], ep, capacity=SimCapacity(1, profile)).end_s


def test_defaults_are_the_short_context_model() -> None:
    base = LatencyProfile("p", 0.0, 0.01, 0.0)
    assert base.generate_ctx_s(5, 10, 2, 0) == base.generate_s(5, 10, 2)
    # two siblings decode side by side: 10 tokens x 0.01 s, the task prompt prefilled free
    assert _run(base) == pytest.approx(0.1)


def test_a_call_decodes_slower_the_more_context_is_in_service() -> None:
    ctx = LatencyProfile("p", 0.0, 0.01, 0.0, decode_s_per_ctx_token=1e-4)
    # the second sibling starts with both contexts (110 + 110 tokens) in service
    assert _run(ctx) == pytest.approx(10 * (0.01 + 1e-4 * 220))
    assert _run(ctx, n=1) == pytest.approx(10 * (0.01 + 1e-4 * 110))


def test_a_call_without_kv_room_waits_for_one_to_finish() -> None:
    capped = LatencyProfile("p", 0.0, 0.01, 0.0, kv_tokens=150)
    assert _run(capped) == pytest.approx(0.2)  # 110 + 110 > 150: one after the other
    assert _run(LatencyProfile("p", 0.0, 0.01, 0.0, kv_tokens=220)) == pytest.approx(0.1)
    # a waiting call that is aborted gives its slot back (over-provisioned group, abort)
    assert _run(capped, straggler=StragglerPolicy.ABORT, pool=2) > 0
