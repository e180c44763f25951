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
    # two siblings decode side by side: 10 tokens x 0.01 s, the task prompt prefilled free
    assert _run(base) == pytest.approx(0.1)


def test_a_call_decodes_slower_the_more_context_is_in_service() -> None:
    ctx = LatencyProfile("p", 0.0, 0.01, 0.0, decode_s_per_ctx_token=1e-4)
    # each step reads the contexts in service, each growing by a token a step: alone from
    # 100 tokens, 10 tokens: 10 (0.01 + 1e-4 x 100) + 1e-4 x 10^2 / 2
    assert _run(ctx, n=1) == pytest.approx(10 * (0.01 + 1e-4 * 100) + 1e-4 * 50)
    # two siblings side by side: twice the context read per step
    assert _run(ctx) == pytest.approx(10 * (0.01 + 1e-4 * 200) + 2e-4 * 50)


def test_a_call_speeds_up_when_the_calls_beside_it_leave() -> None:
    """Regression: the simulator charged a call the KV read of the contexts in service when it
    started for all its tokens, though the engine reads only those still in service at each
    step (on the tb2 trace: naive +129% against the emulated engine)."""
    cfg = SchedulerConfig(groups_per_batch=1, pool_groups=1, sandbox_slots=8, num_batches=1,
                          inference_slots_per_server=8,
                          bank=ReadyBankConfig(group_size=2, max_retries=0, min_valid=1))
    prof = LatencyProfile("p", 0.0, 0.01, 0.0, decode_s_per_ctx_token=1e-3)

    def ep(spec: AttemptSpec) -> SimEpisode:  # slot 0: 10 tokens, slot 1: 30
        return SimEpisode(0.0, turns=(SimTurn(1000, 10 if spec.key.slot == 0 else 30, 0.0),))

    end = simulate(cfg, ["t"], ep, capacity=SimCapacity(1, prof)).end_s
    # both from 1000 tokens: 10 steps of 0.01 + 1e-3 (2000 + 2v), then 20 alone from 1010
    both = 10 * (0.01 + 1e-3 * 2000) + 2e-3 * 10**2 / 2
    alone = 20 * (0.01 + 1e-3 * 1010) + 1e-3 * 20**2 / 2
    assert end == pytest.approx(both + alone)
    assert end < 30 * (0.01 + 1e-3 * 2040)  # the old charge: 30 tokens at the start's KV


def test_the_fluid_server_is_the_exact_integral_of_the_step_time() -> None:
    from rollbank.scheduling.sim.fluid import FluidServer

    f: FluidServer[str] = FluidServer(0.01, 0.001, 1e-4)
    f.admit("a", 0.0, 100, 20, 0.0)
    t_alone = f.next_finish()
    assert t_alone is not None and t_alone[1] == "a"
    assert t_alone[0] == pytest.approx(20 * (0.011 + 1e-4 * 100) + 1e-4 * 200)
    f.admit("b", 0.1, 500, 5, 0.05)  # b's prefill stalls the server 0.05 s
    nxt = f.next_finish()
    assert nxt is not None and nxt[1] == "b"
    f.advance(nxt[0])
    assert f.v == pytest.approx(f._in["b"][1])  # b's target reached exactly then
    f.remove("b", nxt[0])
    end = f.next_finish()
    assert end is not None and end[1] == "a" and end[0] > t_alone[0] + 0.05
    f.remove("a", end[0])
    assert len(f) == 0 and f.next_finish() is None


def test_round_robin_calls_spread_over_the_servers_an_attempt_at_a_time() -> None:
    """Regression: a round-robin arm's attempts all decoded on their group's server in the
    simulator, so a group's long contexts shared one server's KV read (naive +80% on the tb2
    trace); the real round-robin router puts each call on the next server."""
    from rollbank.routing.factory import make_router

    cfg = SchedulerConfig(groups_per_batch=1, pool_groups=1, sandbox_slots=8, num_batches=1,
                          inference_slots_per_server=8,
                          bank=ReadyBankConfig(group_size=4, max_retries=0, min_valid=1))
    prof = LatencyProfile("p", 0.0, 0.01, 0.0, decode_s_per_ctx_token=1e-4)

    def ep(spec: AttemptSpec) -> SimEpisode:
        return SimEpisode(0.0, turns=(SimTurn(1000, 10, 0.0),))

    one = simulate(cfg, ["t"], ep, capacity=SimCapacity(4, prof, prefix_cache=False)).end_s
    rr = simulate(cfg, ["t"], ep, capacity=SimCapacity(
        4, prof, prefix_cache=False,
        router=lambda servers, clock: make_router("round_robin", servers, clock))).end_s
    assert one == pytest.approx(10 * (0.01 + 1e-4 * 4000) + 4e-4 * 50)  # four on one server
    assert rr == pytest.approx(10 * (0.01 + 1e-4 * 1000) + 1e-4 * 50)  # one on each


def test_a_routed_conversation_finds_its_prefix_unless_the_kv_evicted_it() -> None:
    from rollbank.routing.factory import make_router

    cfg = SchedulerConfig(groups_per_batch=2, pool_groups=2, sandbox_slots=8, num_batches=1,
                          inference_slots_per_server=8,
                          bank=ReadyBankConfig(group_size=1, max_retries=0, min_valid=1))

    def ep(spec: AttemptSpec) -> SimEpisode:  # two groups, 3 turns each, long tool calls
        return SimEpisode(0.0, turns=tuple(SimTurn(400 if k == 0 else 50, 20, 5.0)
                                           for k in range(3)))

    def hit(kv: int) -> float:
        res = simulate(cfg, ["a", "b"], ep, capacity=SimCapacity(
            1, LatencyProfile("p", 0.0, 0.01, 0.0, kv_tokens=kv),
            router=lambda servers, clock: make_router("cache_aware", servers, clock)))
        return res.cached_tokens / (res.cached_tokens + res.prefill_tokens)

    # room for both conversations: every later turn finds its whole conversation
    assert hit(10_000) == pytest.approx((420 + 490) * 2 / ((400 + 470 + 540) * 2))
    # room for one: each group's return finds the other's conversation in its place
    assert hit(600) < hit(10_000)


def test_a_call_without_kv_room_waits_for_one_to_finish() -> None:
    capped = LatencyProfile("p", 0.0, 0.01, 0.0, kv_tokens=150)
    assert _run(capped) == pytest.approx(0.2)  # 110 + 110 > 150: one after the other
    assert _run(LatencyProfile("p", 0.0, 0.01, 0.0, kv_tokens=220)) == pytest.approx(0.1)
    # a waiting call that is aborted gives its slot back (over-provisioned group, abort)
    assert _run(capped, straggler=StragglerPolicy.ABORT, pool=2) > 0
