"""Per-batch summary: interval arithmetic, tail share, busy/idle time, utilisation."""

from __future__ import annotations

import pytest

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.spans import Span, add_span
from rollbank.episodes.trajectory import Trajectory
from rollbank.metrics.bound import Capacity
from rollbank.metrics.summary import measure, subtract, summarize_batch, union
from rollbank.quantiles import quantile

CAP = Capacity(10.0, 40.0, 100.0, 400.0, sandbox_slots=4)


def test_interval_helpers() -> None:
    assert union([(0, 2), (1, 3), (5, 6), (6, 7)]) == [(0, 3), (5, 7)]
    assert measure([(0, 2), (1, 3)]) == 3
    assert subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert subtract([(0, 1)], [(0, 1)]) == []


def episode(tid: str, gid: str, *, start: float, infer: list[tuple[float, float, str]],
            tools: list[tuple[float, float]], end: float, reason: Reason, reward: float | None,
            cached: int | None = 0) -> Trajectory:
    t = Trajectory(trajectory_id=tid, group_id=gid, task_id="task", attempt=0,
                   launched_at=start, finished_at=end)
    t.append_prompt([1] * 4)
    for a, b, server in infer:
        t.append_model([7] * 10, [-0.5] * 10, 0)
        add_span(t, Span("inference", a, b, tid, server=server, prompt_tokens=100,
                         cached_tokens=cached, gen_tokens=10))
    for a, b in tools:
        add_span(t, Span("exec", a, b, tid, sandbox=tid))
    add_span(t, Span("episode", start, end, tid, sandbox=tid))
    t.outcome = EpisodeOutcome.of(reason, reward=reward)
    return t


def test_summary_of_a_two_server_batch() -> None:
    a = episode("a", "g1", start=0, infer=[(0, 2, "s0"), (4, 5, "s0")], tools=[(2, 4)], end=5,
                reason=Reason.VERIFIED_PASS, reward=1.0, cached=50)
    b = episode("b", "g1", start=0, infer=[(0, 1, "s1")], tools=[(1, 10)], end=10,
                reason=Reason.VERIFIED_FAIL, reward=0.0, cached=None)
    straggler = episode("c", "g2", start=0, infer=[(0, 3, "s1")], tools=[], end=12,
                        reason=Reason.VERIFIED_FAIL, reward=0.0)
    s = summarize_batch(0, [a, b], t_start=0.0, t_end=10.0, seen=[a, b, straggler],
                        capacity=CAP, servers=["s0", "s1"], group_size=2)
    assert s.time_to_batch_s == 10.0
    assert s.n_groups == 1 and s.n_trajectories == 2
    assert s.t100_s == 10.0
    t90 = quantile([5.0, 10.0], 0.9)
    assert t90 is not None and s.tail_share == pytest.approx((10.0 - t90) / 10.0)
    # s0 busy 3 s, s1 busy 3 s (union of b and c)
    assert s.inference_busy_s == pytest.approx(6.0)
    # env phases cover [1, 10]; s0 idle there except [4, 5] -> 8; s1 idle except [1, 3] -> 7
    assert s.inference_idle_env_s == pytest.approx(7.0 + 7.0)
    # episodes held 5 + 10 + 10 (c clipped) over 4 slots * 10 s
    assert s.sandbox_held_util == pytest.approx(25.0 / 40.0)
    assert s.outcomes == {"model_success": 1, "model_failure": 1}
    # cache hit rate over spans that report it: a (50 + 50 of 200) and c (0 of 100); b reports none
    assert s.prefix_cache_hit_rate == pytest.approx(100 / 300)
    assert s.model_tokens == 40  # spans ending in the window: a 2 + b 1 + c 1 turns of 10
    assert s.tokens_per_s == pytest.approx(4.0)
    assert s.accepted_profile.n == 2 and s.accepted_profile.mean_reward == pytest.approx(0.5)
    assert s.pool_profile.n == 2  # c finished after the window
    # path term: only g1 is complete (g2 has 1 of 2 siblings)
    assert s.lower_bound["groups_in_pool"] == 1
    assert s.efficiency == pytest.approx(s.lower_bound["t_lb_s"] / 10.0)


def test_empty_window_is_not_a_division_by_zero() -> None:
    s = summarize_batch(0, [], t_start=3.0, t_end=3.0, seen=[], capacity=CAP, servers=["s0"])
    assert s.tokens_per_s == 0.0 and s.tail_share == 0.0 and s.efficiency is None
    assert s.prefix_cache_hit_rate is None


def test_the_second_batchs_bound_counts_neither_handed_over_groups_nor_time_already_run() -> None:
    """Regression (the 32 x 8 accel-sim run): a later batch's path term took the G-th smallest
    path over every complete group seen, groups handed over in earlier batches included, and
    whole paths of groups launched before its window (T_LB > T, efficiency up to 1.32)."""
    first = [episode(f"f{i}", "g0", start=0, infer=[], tools=[(0, 2)], end=2,
                     reason=Reason.VERIFIED_PASS, reward=1.0) for i in range(2)]
    carried = [episode(f"c{i}", "g1", start=0, infer=[], tools=[(0, 14)], end=14,
                       reason=Reason.VERIFIED_FAIL, reward=0.0) for i in range(2)]
    cap = Capacity(10.0, 40.0, 100.0, 400.0, sandbox_slots=100)
    s = summarize_batch(1, carried, t_start=10.0, t_end=14.0, seen=first + carried,
                        capacity=cap, servers=["s0"], groups_needed=1, group_size=2,
                        consumed_groups={"g0"})
    assert s.lower_bound["critical_path_s"] == pytest.approx(4.0)  # 14 s path, 10 s before
    assert s.lower_bound["groups_in_pool"] == 1
    assert s.efficiency == pytest.approx(1.0)


def test_a_run_faster_than_its_calibration_never_has_efficiency_above_1() -> None:
    """Regression (a tiny-model run reported efficiency 1.39): the capacity came from a
    calibration measured on a busier host, slower than the run itself, so the modelled critical
    path and inference work exceeded the measured time. A trajectory's time alone cannot exceed
    the time it took, and the servers' rates are at least what the run achieved."""
    slow = Capacity(decode_rate_single=1.0, decode_rate_max=2.0, prefill_rate_single=10.0,
                    prefill_rate_max=20.0, sandbox_slots=8)
    group = [episode(f"t{i}", "g1", start=0, infer=[(0, 1, "s0"), (2, 3, "s0")],
                     tools=[(1, 2)], end=4, reason=Reason.VERIFIED_PASS, reward=1.0)
             for i in range(4)]
    s = summarize_batch(0, group, t_start=0.0, t_end=4.0, seen=group, capacity=slow,
                        servers=["s0"], groups_needed=1, group_size=4)
    assert s.efficiency is not None and 0 < s.efficiency <= 1.0
    lb = s.lower_bound
    assert lb["critical_path_s"] <= 4.0 and lb["inference_work_s"] <= 4.0
    assert lb["sandbox_work_s"] <= 4.0
