"""The lower bound T_LB: critical path, inference work, sandbox work, over-provisioning."""

from __future__ import annotations

import pytest

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.spans import Span, add_span
from rollbank.episodes.trajectory import Trajectory
from rollbank.metrics.bound import Capacity, critical_path, group_paths, lower_bound

CAP = Capacity(decode_rate_single=10.0, decode_rate_max=40.0, prefill_rate_single=100.0,
               prefill_rate_max=400.0, sandbox_slots=2)


def traj(tid: str, gid: str, *, decode: int, prompts: list[tuple[int, int]], tools: list[float],
         setup: float = 0.0, verify: float = 0.0) -> Trajectory:
    t = Trajectory(trajectory_id=tid, group_id=gid, task_id="t", attempt=0)
    t.append_prompt([1] * 5)
    t.append_model([2] * decode, [-0.1] * decode, 0)
    t.sandbox_setup_s, t.verify_s = setup, verify
    for sent, cached in prompts:
        add_span(t, Span("inference", 0.0, 1.0, tid, server="s0", prompt_tokens=sent,
                         cached_tokens=cached, gen_tokens=1))
    for d in tools:
        add_span(t, Span("exec", 0.0, d, tid, sandbox="x"))
    t.outcome = EpisodeOutcome.of(Reason.VERIFIED_FAIL, reward=0.0)
    return t


def test_critical_path_sums_its_terms() -> None:
    t = traj("a", "g", decode=20, prompts=[(100, 0), (150, 100)], tools=[0.5, 1.5], setup=0.25,
             verify=0.75)
    # setup + prefill (100 + 50 uncached at 100 tok/s) + decode 20/10 + tools 2 + verify
    assert critical_path(t, CAP) == pytest.approx(0.25 + 1.5 + 2.0 + 2.0 + 0.75)


def test_ttft_floor_is_charged_per_turn() -> None:
    cap = Capacity(10.0, 40.0, 100.0, 400.0, 2, ttft_floor_s=0.1)
    t = traj("a", "g", decode=0, prompts=[(0, 0), (0, 0), (0, 0)], tools=[])
    assert critical_path(t, cap) == pytest.approx(0.3)


def test_group_path_is_slowest_sibling() -> None:
    a = traj("a", "g1", decode=10, prompts=[], tools=[1.0])
    b = traj("b", "g1", decode=10, prompts=[], tools=[5.0])
    assert group_paths([a, b], CAP) == {"g1": pytest.approx(6.0)}


def test_binding_term_and_efficiency() -> None:
    # Work-bound: 4 trajectories x 100 decode tokens at 40 tok/s aggregate = 10 s, paths 10 s
    ts = [traj(f"t{i}", f"g{i}", decode=100, prompts=[], tools=[]) for i in range(4)]
    lb = lower_bound(ts, CAP)
    assert lb.critical_path_s == pytest.approx(10.0)
    assert lb.inference_work_s == pytest.approx(10.0)
    assert lb.sandbox_work_s == pytest.approx(4 * 10.0 / 2)
    assert lb.t_lb == pytest.approx(20.0)
    assert lb.binding_term == "sandbox_work"
    assert lb.efficiency(40.0) == pytest.approx(0.5)
    assert lb.efficiency(0.0) is None


def test_over_provisioning_takes_gth_smallest_group_path_of_the_pool() -> None:
    pool = [traj(f"t{i}", f"g{i}", decode=0, prompts=[], tools=[float(i + 1)]) for i in range(5)]
    accepted = pool[:2]
    lb = lower_bound(accepted, CAP, pool=pool, groups_needed=2)
    assert lb.critical_path_s == pytest.approx(2.0)  # 2nd smallest of 1..5
    assert lb.groups_in_pool == 5
    # without over-provisioning the accepted groups themselves decide
    assert lower_bound(pool, CAP).critical_path_s == pytest.approx(5.0)


def test_capacity_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Capacity(0.0, 1.0, 1.0, 1.0, 1)
    with pytest.raises(ValueError):
        Capacity(1.0, 1.0, 1.0, 1.0, 0)


def test_verifier_work_term_only_with_declared_verifier_slots() -> None:
    ts = [traj(f"t{i}", f"g{i}", decode=0, prompts=[], tools=[], verify=3.0) for i in range(4)]
    assert lower_bound(ts, CAP).verifier_work_s == 0.0
    cap = Capacity(10.0, 40.0, 100.0, 400.0, sandbox_slots=64, verifier_slots=2)
    lb = lower_bound(ts, cap)
    assert lb.verifier_work_s == pytest.approx(4 * 3.0 / 2)
    assert lb.binding_term == "verifier_work" and lb.t_lb == pytest.approx(6.0)


def test_a_group_carried_from_the_previous_window_counts_only_what_remains() -> None:
    """Regression: a later batch's bound counted the whole path of a group launched during the
    previous window, so the measured 32 x 8 run's batches 2-3 had T_LB > T (efficiency 1.10)."""
    cap = Capacity(decode_rate_single=10, decode_rate_max=100, prefill_rate_single=1000,
                   prefill_rate_max=1000, sandbox_slots=1)
    carried = traj("a", "g1", decode=0, prompts=[], tools=[60.0])
    carried.launched_at = 50.0
    fresh = traj("b", "g2", decode=0, prompts=[], tools=[30.0])
    fresh.launched_at = 100.0
    late = traj("c", "g3", decode=0, prompts=[], tools=[20.0])
    late.launched_at = 0.0  # launched long before: nothing of its path need remain
    whole = lower_bound([carried], cap, pool=[carried, fresh], groups_needed=1)
    assert whole.critical_path_s == pytest.approx(30.0)  # no window start: whole paths
    lb = lower_bound([carried], cap, pool=[carried, fresh], groups_needed=1, window_start=100.0)
    assert lb.critical_path_s == pytest.approx(10.0)  # 60 s path, 50 s of it before the window
    assert lb.sandbox_work_s == pytest.approx(10.0)
    lb2 = lower_bound([carried, fresh, late], cap, groups_needed=3, window_start=100.0)
    assert lb2.critical_path_s == pytest.approx(30.0) and lb2.sandbox_work_s == pytest.approx(40.0)


def test_verifier_work_counts_only_verification_inside_the_window() -> None:
    """Regression (a fake-engine collect, batch 1: efficiency 1.93): the verifier term summed
    the whole verification of groups carried from the previous window, verified before it."""
    cap = Capacity(10.0, 40.0, 100.0, 400.0, sandbox_slots=64, verifier_slots=2)
    ts = []
    for i in range(4):
        t = traj(f"t{i}", "g", decode=0, prompts=[], tools=[], verify=10.0)
        t.launched_at, t.finished_at = 0.0, 31.0
        add_span(t, Span("verify", 20.0, 30.0, t.trajectory_id, sandbox="x"))
        ts.append(t)
    assert lower_bound(ts, cap).verifier_work_s == pytest.approx(20.0)  # whole runs
    lb = lower_bound(ts, cap, window_start=25.0)
    assert lb.verifier_work_s == pytest.approx(4 * 5.0 / 2)  # the 5 s of each inside the window
