"""The simulator's inference, verifier and prefix-cache model against hand-computed cases."""

from __future__ import annotations

from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig, SchedulingMode
from rollbank.scheduling.policy.types import AttemptSpec
from rollbank.scheduling.sim.sim_model import LatencyProfile, SimCapacity, SimTurn
from rollbank.scheduling.sim.simulate import SimEpisode, SimResult, simulate

TASKS = ["t0"]


def _cfg(groups: int = 1, n: int = 2, **kw: object) -> SchedulerConfig:
    base: dict[str, object] = {"groups_per_batch": groups, "pool_groups": groups,
                               "sandbox_slots": 8, "num_batches": 1,
                               "bank": ReadyBankConfig(group_size=n)}
    return SchedulerConfig(**(base | kw))  # type: ignore[arg-type]


def _cap(prefill: float = 0.0, decode: float = 1.0, slope: float = 0.0,
         cache: bool = True) -> SimCapacity:
    return SimCapacity(1, LatencyProfile("hand", prefill, decode, slope), prefix_cache=cache)


def _run(cfg: SchedulerConfig, cap: SimCapacity, turns: tuple[SimTurn, ...]) -> SimResult:
    return simulate(cfg, TASKS, lambda _s: SimEpisode(0.0, turns=turns), capacity=cap)


def test_one_inference_slot_serialises_the_siblings() -> None:
    # 2 tokens at 1 s/token: slot 0 decodes 0-2 s, slot 1 waits and decodes 2-4 s
    res = _run(_cfg(inference_slots_per_server=1), _cap(), (SimTurn(0, 2),))
    assert res.end_s == 4.0
    assert res.inference_wait_s == 2.0 and res.inference_busy_s == 4.0


def test_decode_slows_with_the_batch_it_joins() -> None:
    # two slots: the first call joins a batch of 1 (1 s/token), the second a batch of 2
    # (1 + 0.5 = 1.5 s/token): 2 tokens -> 2 s and 3 s
    res = _run(_cfg(inference_slots_per_server=2), _cap(slope=0.5), (SimTurn(0, 2),))
    assert res.end_s == 3.0 and res.inference_wait_s == 0.0


def test_siblings_share_the_cached_task_prompt_and_later_turns_prefill_only_new_tokens() -> None:
    # prompt 10 tokens at 0.1 s, decode free; turn 2 adds 5 observation tokens
    turns = (SimTurn(10, 1, 0.0), SimTurn(5, 1, 0.0))
    cached = _run(_cfg(inference_slots_per_server=1), _cap(0.1, 0.0), turns)
    # sibling 0: 10 + 5 tokens; sibling 1: prompt cached, 5 tokens -> 2.0 s of prefill
    assert cached.prefill_tokens == 20 and abs(cached.end_s - 2.0) < 1e-9
    # no cache: each turn prefills the whole conversation: 10, then 10 + 1 + 5 per sibling
    cold = _run(_cfg(inference_slots_per_server=1), _cap(0.1, 0.0, cache=False), turns)
    assert cold.prefill_tokens == 2 * (10 + 16) and abs(cold.end_s - 5.2) < 1e-9
    assert cached.cached_tokens == 2 * 11 + 10 and cold.cached_tokens == 0


def _durations(spec: AttemptSpec) -> SimEpisode:
    start = {(0, 0): 1.0, (0, 1): 5.0, (1, 0): 0.5, (1, 1): 0.5}[(spec.key.seq, spec.key.slot)]
    return SimEpisode(start, verify_s=1.0)


def test_one_verifier_slot_serves_the_group_closest_to_complete_first() -> None:
    """g1's siblings reach the verifier at 0.5 s (one verifies 0.5-1.5, one waits); g0's
    slot 0 at 1.0 s while its slot 1 still runs. At 1.5 s g1 (nothing left running) goes
    first: g1 completes at 2.5 s; g0's slot 0 verifies 2.5-3.5, slot 1 5-6 s."""
    cfg = _cfg(groups=2, verifier_slots=1)
    res = simulate(cfg, TASKS, _durations)
    done = {g.group_id: g.completed_at for g in res.batches[0].groups}
    assert done == {"g00000": 6.0, "g00001": 2.5}
    assert res.verifier_wait_s == (1.5 - 0.5) + (2.5 - 1.0)
    # without a limit nobody waits: g1 completes at 1.5 s
    free = simulate(_cfg(groups=2), TASKS, _durations)
    assert {g.group_id: g.completed_at for g in free.batches[0].groups}["g00001"] == 1.5


def test_naive_verifier_queue_is_first_come_first_served() -> None:
    # same arrivals; FIFO also serves g1's waiter (0.5 s) before g0's (1.0 s) here
    cfg = _cfg(groups=2, verifier_slots=1, mode=SchedulingMode.NAIVE)
    res = simulate(cfg, TASKS, _durations)
    assert {g.group_id: g.completed_at for g in res.batches[0].groups} == {
        "g00000": 6.0, "g00001": 2.5}


def test_verifier_priority_beats_seq_order_when_the_younger_group_is_closer() -> None:
    """g0 slot 0 waits from 0.6 s, before g1's slot 1 (0.7 s); FIFO or seq order would
    serve g0 first, the completion rank serves g1 (no sibling left running)."""
    starts = {(0, 0): 0.6, (0, 1): 9.0, (1, 0): 0.5, (1, 1): 0.7}

    def wl(spec: AttemptSpec) -> SimEpisode:
        return SimEpisode(starts[(spec.key.seq, spec.key.slot)], verify_s=1.0)

    res = simulate(_cfg(groups=2, verifier_slots=1), TASKS, wl)
    done = {g.group_id: g.completed_at for g in res.batches[0].groups}
    assert done["g00001"] == 2.5  # g1 slot 1 verifies 1.5-2.5
    naive = simulate(_cfg(groups=2, verifier_slots=1, mode=SchedulingMode.NAIVE), TASKS, wl)
    assert {g.group_id: g.completed_at for g in naive.batches[0].groups}["g00001"] == 3.5


def test_a_waiting_verifier_holds_the_extra_group_back_only_when_configured() -> None:
    # G = 1, G' = 2, n = 3, 3 sandbox slots, 1 verifier slot of 1 s. g0: slot 0 ends at 0.5
    # and verifies 0.5-1.5; slots 1 and 2 end at 1.0 and wait. At 1.5 slot 0's sandbox frees,
    # slot 1 verifies and slot 2 still waits: the verifier is contended. Held (default), the
    # extra g1 starts at 2.5, when nobody waits any more; not held, at 1.5.
    def ep(spec: AttemptSpec) -> SimEpisode:
        return SimEpisode({(0, 0): 0.5}.get((spec.key.seq, spec.key.slot), 1.0), verify_s=1.0)

    starts = {}
    for hold in (True, False):
        cfg = _cfg(1, 3, pool_groups=2, num_batches=2, sandbox_slots=3, verifier_slots=1,
                   hold_extras_for_verifier=hold)
        res = simulate(cfg, TASKS, ep, capacity=_cap(0.0, 0.0))
        g1 = res.batches[1].groups[0]
        starts[hold] = sorted(t.launched_at for t in g1.trajectories)
    assert starts[True] == [2.5, 2.5, 3.5]
    assert starts[False] == [1.5, 2.5, 3.5]
