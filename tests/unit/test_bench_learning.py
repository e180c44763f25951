"""The learning bench's task family, verifier and summaries (pure parts)."""

from __future__ import annotations

from typing import Any

from rollbank.bench.learning.report import arm_summary, auc, pipelined_wall, verdict
from rollbank.bench.learning.tasks import AdditionTask, eval_tasks, parse_action, step_tasks, verify


def test_verifier_accepts_only_the_right_answer_in_the_action_format() -> None:
    task = AdditionTask(13, 7, 2)
    assert task.prompt == "Q: 13+7=? A:"
    assert verify(task, " echo 20 > answer.txt\n") == 1.0
    assert verify(task, task.action) == 1.0
    assert verify(task, " echo 21 > answer.txt\n") == 0.0
    assert verify(task, " echo 20 > answer.txt; rm -rf /\n") == 0.0
    assert verify(task, "20") == 0.0
    assert parse_action(" echo -3 > answer.txt") == -3


def test_step_tasks_are_the_same_for_every_arm_and_differ_by_step() -> None:
    assert step_tasks(0, 5, 8) == step_tasks(0, 5, 8)
    assert step_tasks(0, 5, 8) != step_tasks(0, 6, 8)
    assert step_tasks(0, 5, 8) != step_tasks(1, 5, 8)
    assert eval_tasks(16) == eval_tasks(16)
    assert {t.level for t in eval_tasks(64)} == {1, 2, 3}


def _arm(name: str, lag: int, gated: bool, evals: list[float], step_s: tuple[float, float]) -> dict[str, Any]:
    steps = [{"step": i, "samples": 8 * (i + 1), "reward": 0.5, "zero_variance_groups": 0,
              "divergence": {"k3": 0.0, "ess": 1.0}, "divergence_before_gate": {"k3": 0.1},
              "sample_seconds": step_s[0], "score_seconds": 0.0, "train_seconds": step_s[1]}
             for i in range(2)]
    return {"arm": name, "lag": lag, "gated": gated, "seed": 0, "correction": "none",
            "steps": steps, "evals": [{"solve_rate": r} for r in evals], "wall_seconds": 1.0}


def test_summaries_compare_per_sample_with_sync() -> None:
    sync = _arm("sync", 0, False, [0.1, 0.2, 0.4], (1.0, 2.0))
    gated = _arm("gated", 4, True, [0.1, 0.2, 0.39], (1.0, 2.0))
    bad = _arm("ungated-lag8", 8, False, [0.1, 0.1, 0.2], (1.0, 2.0))
    assert auc(sync) == (0.2 + 0.4) / 2
    assert pipelined_wall(sync) == 6.0  # sync: sampling and training add up
    assert pipelined_wall(gated) == 4.0  # async: the longer of the two per step
    s_sync, s_gated, s_bad = (arm_summary(sync, None), arm_summary(gated, sync), arm_summary(bad, sync))
    assert s_gated["within_5pct_of_sync"] is True
    assert abs(s_gated["auc_gap_vs_sync"] - (0.295 - 0.3) / 0.3) < 1e-12
    assert s_bad["within_5pct_of_sync"] is False
    v = verdict([s_sync, s_gated, s_bad])["per_seed"][0]
    assert v["sync_learned"] is True
    assert v["gated_within_5pct"] is True
    assert v["first_degraded_lag"] == 8
