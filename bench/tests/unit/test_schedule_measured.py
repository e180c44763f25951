"""bench schedule --from-measured: the measured inputs (costs, budgets, profile) and the
simulated-vs-measured comparison, on hand cases."""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from typing import Any

import pytest

from rollbank.episodes.workload import TraceWorkload, WorkloadConfig
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec
from rollbank.scheduling.sim.sim_model import LatencyProfile
from rollbank_bench.schedule_measured import budgeted, compare, episode_model, simulate_arm
from rollbank_bench.sim_inputs import ArmCosts, costs_from_episodes, free_time, sim_profile

WL = {"kind": "trace", "turns_median": 4.0, "tool_latency_median_s": 2.0}


def test_budget_cuts_the_turn_that_spends_it_and_drops_later_turns() -> None:
    assert budgeted([1.0, 2.0, 3.0], None) == [1.0, 2.0, 3.0]
    assert budgeted([1.0, 2.0, 3.0], 10.0) == [1.0, 2.0, 3.0]
    assert budgeted([1.0, 2.0, 3.0], 2.5) == [1.0, 1.5]
    assert budgeted([1.0, 2.0, 3.0], 3.0) == [1.0, 2.0]  # spent exactly: the runner stops
    assert budgeted([5.0, 1.0], 2.0) == [2.0]


def test_call_overhead_is_added_once_per_generate_call() -> None:
    p = LatencyProfile("p", prefill_s_per_token=0.001, decode_s_per_token=0.01,
                       decode_batch_slope=0.5, call_s=0.2)
    # 0.2 + 100 x 0.001 + 10 x 0.01 x (1 + 0.5 x 2)
    assert p.generate_s(100, 10, 3) == pytest.approx(0.2 + 0.1 + 0.2)
    assert LatencyProfile("q").generate_s(0, 0, 1) == 0.0


def test_accelsim_profile_maps_to_per_call_decode_and_batch_slope() -> None:
    accel = SimpleNamespace(name="a", step_base_s=0.006, decode_per_seq_s=0.001,
                            decode_per_ctx_token_s=1e-6, prefill_per_token_s=5e-5)
    p = sim_profile(accel, context_tokens=1000, call_s=0.01)
    # alone: 6 ms base + 1 ms per sequence + 1000 x 1 us context = 8 ms; each more sequence 2 ms
    assert p.decode_s(1) == pytest.approx(0.008)
    assert p.decode_s(4) == pytest.approx(0.008 + 3 * 0.002)
    assert (p.prefill_s_per_token, p.call_s) == (5e-5, 0.01)


def _record(w: TraceWorkload, task: str, seed: int, *, setup: float, over: float, call: float,
            verify: float, close: float, decode: float) -> dict[str, Any]:
    plan = w.plan(task, seed)
    steps: list[dict[str, Any]] = [
        {"action": f"sleep {t.tool_s:.3f}", "exec_s": t.tool_s + over / 2,
         "inference_s": t.tokens * decode + call} for t in plan.turns]
    inf = sum(t.tokens * decode + call for t in plan.turns)
    tool = plan.tool_s + over * len(steps)
    gen = plan.tokens
    return {"task_id": task, "seed": seed, "steps": steps,
            "timings": {"launched_at": 10.0, "sandbox_setup_s": setup, "inference_s": inf,
                        "tool_s": tool, "verify_s": verify,
                        "finished_at": 10.0 + setup + inf + tool + verify + close},
            "tokens": {"prompt_len": 600, "token_ids": [1] * (600 + gen + 20 * (len(steps) - 1))}}


def test_costs_are_what_the_plan_does_not_say_medians_and_mean_verifier() -> None:
    w = TraceWorkload(WorkloadConfig.model_validate(WL))
    recs = [_record(w, "t", s, setup=0.5 + 0.1 * s, over=0.05, call=0.02,
                    verify=5.3 if s == 4 else 0.3, close=1.0, decode=0.01) for s in range(5)]
    recs[0]["steps"][0]["action"] = "sleep 99.000"  # an attempt that did not run its plan
    costs, check = costs_from_episodes(recs, w, LatencyProfile("p", decode_s_per_token=0.01))
    assert check == {"finished": 5, "ran_planned_sleeps": 4}
    assert costs.setup_s == pytest.approx(0.7)  # median of 0.5..0.9
    assert costs.call_s == pytest.approx(0.02)
    # the verifier is a queue when contended: its throughput is set by the mean run
    assert costs.verify_s == pytest.approx(1.3) and costs.close_s == pytest.approx(1.0)
    assert costs.turn_overhead_s == pytest.approx(0.05)
    assert (costs.prompt_tokens, costs.obs_tokens) == (600, 20)


def _spec(task: str, seed: int) -> AttemptSpec:
    return AttemptSpec(AttemptKey(0, 0, 0, "g0"), task, seed, 1, 0.0)


def test_episode_model_adds_measured_costs_to_the_plan_under_the_budget() -> None:
    w = TraceWorkload(WorkloadConfig.model_validate(WL))
    plan = w.plan("t", 0)  # 5 turns
    costs = ArmCosts(setup_s=0.4, turn_overhead_s=0.1, verify_s=0.3, close_s=1.0)
    inputs = {"workload": WL, "budgets": {}}
    ep = episode_model(inputs, costs)(_spec("t", 0))
    assert ep.duration_s == 0.4 and ep.verify_s == 0.3 and len(ep.turns) == len(plan.turns)
    assert sum(t.tool_s for t in ep.turns) == pytest.approx(
        plan.tool_s + 0.1 * len(plan.turns) + 1.0)  # close after the last turn
    first = plan.turns[0].tool_s
    cut = episode_model({**inputs, "budgets": {"t": first / 2}}, costs)(_spec("t", 0))
    assert [t.tool_s for t in cut.turns] == pytest.approx([first / 2 + 1.0])
    # the budget counts the command's round trip too: 2 turns' sleeps + overheads
    two = plan.turns[0].tool_s + plan.turns[1].tool_s + 0.2
    cut2 = episode_model({**inputs, "budgets": {"t": two}}, costs)(_spec("t", 0))
    assert len(cut2.turns) == 2 and sum(t.tool_s for t in cut2.turns) == pytest.approx(two + 1.0)


def _report(measured_s: float, costs: ArmCosts) -> dict[str, Any]:
    sched = {"mode": "naive", "groups_per_batch": 1, "pool_groups": 1, "num_batches": 1,
             "sandbox_slots": 1, "inference_slots_per_server": 1, "verifier_slots": 1,
             "straggler": "wait", "seed": 0, "bank": {"group_size": 1, "min_valid": 1}}
    inputs = {"scheduler": sched, "workload": WL, "task_ids": ["t"], "budgets": {},
              "costs": costs.to_dict()}
    return {"benchmark": "collect", "engine": {"kind": "accel-sim",
                                               "profile": "h100-llama3.1-8b", "servers": 1},
            "arms": {"naive": {"time_per_batch_s": measured_s, "batch_times_s": [measured_s],
                               "ledger": {"launched": 1, "waste": 0}, "sim_inputs": inputs}}}


def test_one_attempt_simulates_to_the_sum_of_its_parts_and_error_is_relative() -> None:
    from rollbank.scheduling.policy.scheduler import attempt_seed
    from rollbank_bench.accelsim.profile import load_profile

    costs = ArmCosts(setup_s=0.5, turn_overhead_s=0.05, call_s=0.01, verify_s=0.3,
                     close_s=1.0, prompt_tokens=600, obs_tokens=20)
    plan = TraceWorkload(WorkloadConfig.model_validate(WL)).plan("t", attempt_seed(0, 0, 0))
    prof = sim_profile(load_profile("h100-llama3.1-8b"), context_tokens=600, call_s=0.01)
    expect = 0.5 + 1.0 + 0.3 + sum(
        prof.generate_s(600 if k == 0 else 20, t.tokens, 1) + t.tool_s + 0.05
        for k, t in enumerate(plan.turns))
    report = _report(expect * 1.25, costs)
    _, sim = simulate_arm(report, report["arms"]["naive"]["sim_inputs"])
    assert sim["time_per_batch_s"] == pytest.approx(expect, abs=0.01)
    out = compare(report)
    assert out["arms"]["naive"]["error"] == pytest.approx(-0.2, abs=1e-3)
    assert out["max_abs_error"] == pytest.approx(0.2, abs=1e-3)


def test_cpu_regime_runs_are_refused() -> None:
    from rollbank.errors import UsageError

    report = _report(10.0, ArmCosts())
    report["engine"] = None
    with pytest.raises(UsageError, match="accel-sim"):
        compare(report)


def test_from_measured_flag_is_wired() -> None:
    from rollbank_bench.schedule import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    a = p.parse_args(["--from-measured", "x.json", "--sweep"])
    assert (a.from_measured, a.sweep) == ("x.json", True)


def test_free_time_counts_only_where_a_verifier_slot_was_free() -> None:
    busy = [(0.0, 10.0), (5.0, 20.0)]
    assert free_time(0.0, 30.0, busy, 2) == pytest.approx(25.0)  # both busy only 5-10
    assert free_time(0.0, 30.0, busy, 1) == pytest.approx(10.0)  # 20-30 free
    assert free_time(6.0, 9.0, busy, 2) == 0.0
    assert free_time(9.0, 6.0, busy, 2) == 0.0


def test_verifier_slot_wait_is_not_a_cost_only_free_gap_time_and_the_tail_are() -> None:
    w = TraceWorkload(WorkloadConfig.model_validate(WL))
    recs = []
    for s in range(5):  # all end their turns at 100 s; one verifier slot, 2 s per run
        r = _record(w, "t", s, setup=0.5, over=0.0, call=0.0, verify=2.0, close=0.0,
                    decode=0.01)
        start = 100.1 + 2.0 * s  # 0.1 s to close the shell, then the queue for the slot
        r["spans"] = [{"kind": "exec", "start": 90.0, "end": 100.0},
                      {"kind": "verify", "start": start, "end": start + 2.0}]
        r["timings"]["finished_at"] = start + 2.0 + 0.7  # teardown + record after it
        recs.append(r)
    costs, _ = costs_from_episodes(recs, w, LatencyProfile("p", decode_s_per_token=0.01),
                                   verifier_slots=1)
    assert costs.close_s == pytest.approx(0.1 + 0.7)  # not 0.7 + the median gap (4.1 s)
    assert costs.verify_s == pytest.approx(2.0)


def test_interleaved_runs_are_compared_repeat_by_repeat_on_their_own_inputs() -> None:
    from rollbank_bench.schedule_measured import per_repeat

    quiet, loaded = _report(10.0, ArmCosts(verify_s=0.3)), _report(10.0, ArmCosts(verify_s=30.0))
    report = {**quiet, "repeats": [{"repeat": 0, "order": ["naive"], "arms": quiet["arms"]},
                                   {"repeat": 1, "order": ["naive"], "arms": loaded["arms"]}]}
    rows = per_repeat(report)
    assert [r["repeat"] for r in rows] == [0, 1] and rows[1]["order"] == ["naive"]
    sims = [r["arms"]["naive"]["simulated_s"] for r in rows]
    assert sims[1] - sims[0] == pytest.approx(29.7, abs=0.05)  # repeat 1's own verifier cost


def test_scaled_accelsim_profile_maps_to_the_long_context_model() -> None:
    from rollbank_bench.accelsim.profile import load_profile, with_overrides
    from rollbank_bench.sim_inputs import sim_profile_long

    accel = with_overrides(load_profile("h100-llama3.1-8b"), token_scale=16, time_scale=30)
    p = sim_profile_long(accel, call_s=0.01)
    # one wire token alone at wire context L costs the engine's scaled step: k (base + per_seq
    # + k L per_ctx) / c
    want = accel.step_time(decode_seqs=1, decode_ctx_tokens=500)
    assert p.decode_s(1) + p.decode_s_per_ctx_token * 500 == pytest.approx(want)
    assert p.call_s == 0.01
    assert p.kv_tokens == accel.kv_capacity_blocks * accel.block_size == 450_000 // 16 // 16 * 16
    assert p.prefill_s_per_token == pytest.approx(16 * 5e-5 / 30)


def test_printed_tool_output_enters_the_next_turns_prompt() -> None:
    wl = {**WL, "observation_chars_median": 100.0, "observation_chars_sigma": 0.5}
    w = TraceWorkload(WorkloadConfig.model_validate(wl))
    costs = ArmCosts(obs_tokens=10, obs_tokens_per_char=0.5, prompt_tokens=300)
    spec = AttemptSpec(AttemptKey(0, 0, 0, "g0"), "t", 7, 1, 0.0)
    plan = w.plan("t", 7).turns
    ep = episode_model({"workload": wl}, costs)(spec)
    assert ep.turns[0].prompt_tokens == 300
    assert [t.prompt_tokens for t in ep.turns[1:]] == [
        10 + round(0.5 * p.obs_chars) for p in plan[:-1]]


def test_what_if_more_verifier_slots_resimulates_every_arm() -> None:
    from rollbank_bench.schedule_measured import what_if_verifiers

    report = _report(10.0, ArmCosts(verify_s=30.0))
    naive = report["arms"]["naive"]
    sched = {**naive["sim_inputs"]["scheduler"], "groups_per_batch": 2, "pool_groups": 2,
             "sandbox_slots": 4, "bank": {"group_size": 2, "min_valid": 1}}
    naive["sim_inputs"] = {**naive["sim_inputs"], "scheduler": sched}
    one = compare(report)["arms"]["naive"]["simulated_s"]
    w = what_if_verifiers(report, 4)
    assert w["verifier_slots"] == 4 and w["arms"]["naive"]["ratio_vs_naive"] == 1.0
    # four verifications that queued behind one slot now run side by side
    assert w["arms"]["naive"]["time_per_batch_s"] < one


def test_at_scale_runs_both_measured_arms_to_n_trajectories_keeping_the_spare_groups() -> None:
    import copy

    from rollbank_bench.schedule_measured_scale import at_scale

    report = _report(10.0, ArmCosts(verify_s=1.0))
    naive = report["arms"]["naive"]
    sched = {**naive["sim_inputs"]["scheduler"], "groups_per_batch": 2, "pool_groups": 2,
             "sandbox_slots": 4, "num_batches": 1, "bank": {"group_size": 2, "min_valid": 1}}
    naive["sim_inputs"] = {**naive["sim_inputs"], "scheduler": sched}
    opt = report["arms"]["optimized"] = copy.deepcopy(naive)
    opt["sim_inputs"]["scheduler"].update(mode="optimized", pool_groups=3, max_groups=3)
    out = at_scale(report, 40)  # 10 batches of 2 x 2
    for arm in ("naive", "optimized"):
        assert out[arm]["batches"] == 10 and out[arm]["trajectories"] == 40
    # the measured cap (one spare group over one batch) would stop at 3 groups: it grew with
    # the batches, one spare group still, so at most 10 x 2 + 1 groups of 2 were launched
    assert 40 <= out["optimized"]["launched"] <= 42
    assert out["both_arms_wall_s"] == pytest.approx(out["naive"]["wall_s"] + out["optimized"]["wall_s"])
    del report["arms"]["optimized"]
    from rollbank.errors import UsageError

    with pytest.raises(UsageError, match="no optimized arm"):
        at_scale(report, 40)


def test_turns_stop_where_the_runner_runs_out_of_context() -> None:
    """Regression: the simulator ran every planned turn, though the runner ends an episode
    whose next turn would not fit ``max_model_len`` (25 of 768 naive attempts on the tb2 trace
    at 8192 tokens, the batch's slowest among them: the simulated tail ran 48-50 turns where
    the measured one stopped at 31)."""
    from rollbank_bench.schedule_measured import context_limited

    turns = [(100, 50, 1.0), (30, 50, 1.0), (30, 50, 1.0), (30, 50, 1.0)]
    assert context_limited(turns, None) == turns
    # 100 + 50 + 30 + 50 = 230; the next observation (30) + 16 would pass 270
    assert context_limited(turns, {"max_model_len": 270, "min_new_tokens": 16}) == turns[:2]
    # the room left caps a turn's tokens: 100 + 30 = 130 of 160, 30 left
    assert context_limited(turns, {"max_model_len": 160, "min_new_tokens": 16}) == [
        (100, 50, 1.0)]
    assert context_limited([(100, 50, 1.0)], {"max_model_len": 120, "min_new_tokens": 16}) == [
        (100, 20, 1.0)]
    assert context_limited([(100, 50, 1.0)], {"max_model_len": 110, "min_new_tokens": 16}) == []


def test_the_call_overhead_of_the_long_context_model_comes_from_calls_alone() -> None:
    """Regression: the overhead was a call's time beyond a lone decode at the prompt's length,
    over all calls (1.32 s on the tb2 trace), counting the batching and KV read that the
    simulator charges again; only calls alone on their server measure it."""
    from rollbank_bench.sim_inputs import lone_call_overhead

    prof = LatencyProfile("p", prefill_s_per_token=0.0, decode_s_per_token=0.01,
                          decode_batch_slope=0.0, decode_s_per_ctx_token=1e-5)

    def span(start: float, dur: float, server: str = "a") -> dict[str, Any]:
        return {"kind": "inference", "start": start, "end": start + dur, "server": server,
                "prompt_tokens": 1000, "cached_tokens": 1000, "gen_tokens": 10}

    lone = 10 * (0.01 + 1e-5 * 1000) + 1e-5 * 50  # 10 tokens from 1000 of context
    recs = [{"spans": [span(0.0, lone + 0.02), span(1.0, 5.0), span(2.0, 5.0),
                       span(2.5, lone + 0.04, "b"), span(10.0, lone + 0.03)]}]
    over, n = lone_call_overhead(recs, prof)
    assert n == 3 and over == pytest.approx(0.03)  # the two overlapping calls left out
    assert lone_call_overhead([{"spans": [span(0.0, 5.0), span(1.0, 5.0)]}], prof) == (None, 0)


def test_each_attempt_verifies_for_as_long_as_it_was_measured_to() -> None:
    """Regression (the simulated verifier queue was a fraction of the measured one): every
    attempt verified for the arm's mean, but verifiers share the host's cores and run slower
    exactly when many episodes end at once; the measured per-attempt times are replayed, as
    plans are, and the mean stays for attempts the run did not measure."""
    from rollbank_bench.schedule_measured import episode_model
    from rollbank_bench.sim_inputs import attempt_key, verify_times

    w = TraceWorkload(WorkloadConfig.model_validate(WL))
    recs = [_record(w, "t", s, setup=0.5, over=0.0, call=0.0, verify=v, close=0.0, decode=0.01)
            for s, v in ((0, 0.25), (1, 3.0))]
    by = verify_times(recs)
    assert by == {attempt_key("t", 0): 0.25, attempt_key("t", 1): 3.0}
    costs = ArmCosts(verify_s=1.0)
    fn = episode_model({"workload": WL, "verify_s_by_attempt": by}, costs)

    class Spec:
        def __init__(self, seed: int) -> None:
            self.task_id, self.seed = "t", seed

    assert [fn(Spec(s)).verify_s for s in (0, 1, 2)] == [0.25, 3.0, 1.0]
