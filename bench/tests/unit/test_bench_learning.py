"""The learning bench's task family, verifier and summaries (pure parts)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from rollbank_bench.learning.aggregate import aggregate, mean_se
from rollbank_bench.learning.command import merged_arms
from rollbank_bench.learning.report import arm_summary, auc, pipelined_wall, verdict
from rollbank_bench.learning.tasks import AdditionTask, eval_tasks, parse_action, step_tasks, verify


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


def _seeded(name: str, lag: int, seed: int, evals: list[float]) -> dict[str, Any]:
    arm = _arm(name, lag, name == "gated", evals, (1.0, 1.0))
    arm["seed"] = seed
    arm["evals"] = [{"solve_rate": r, "samples": 10 * k} for k, r in enumerate(evals)]
    return arm


def test_mean_and_standard_error_by_hand() -> None:
    assert mean_se([0.1, 0.2, 0.3]) == pytest.approx({"mean": 0.2, "se": 0.1 / math.sqrt(3), "n": 3})
    assert mean_se([0.5]) == {"mean": 0.5, "se": None, "n": 1}
    assert mean_se([]) == {"mean": None, "se": None, "n": 0}


def test_aggregate_across_seeds_pairs_each_arm_with_sync_of_its_seed() -> None:
    arms = [_seeded("sync", 0, 0, [0.1, 0.2, 0.2]), _seeded("sync", 0, 1, [0.1, 0.2, 0.4]),
            _seeded("gated", 4, 0, [0.1, 0.2, 0.1]), _seeded("gated", 4, 1, [0.1, 0.3, 0.3])]
    agg = aggregate(arms)
    sync, gated = agg["arms"]["sync"], agg["arms"]["gated"]
    assert sync["seeds"] == [0, 1] and gated["lag"] == 4
    assert [p["samples"] for p in sync["curve"]] == [0, 10, 20]
    assert sync["curve"][2]["mean"] == pytest.approx(0.3)
    assert sync["curve"][2]["se"] == pytest.approx(0.1)  # sd 0.1414 / sqrt 2
    assert sync["final"]["mean"] == pytest.approx(0.3)
    assert sync["auc"]["mean"] == pytest.approx((0.2 + 0.3) / 2)  # auc 0.2 and 0.3
    gap = gated["gap_vs_sync"]
    assert gap["gap_of_means"] == pytest.approx((0.225 - 0.25) / 0.25)  # gated auc 0.15, 0.3
    assert gap["per_seed"] == pytest.approx({"0": -0.25, "1": 0.0})
    assert gap["paired"]["mean"] == pytest.approx(-0.125)
    assert gap["paired"]["se"] == pytest.approx(0.125)
    v = agg["gated_verdict"]
    assert v["within_5pct"] is False
    assert v["paired_mean_2se"] == "undecided"  # -0.125 +- 0.25 straddles -5 %
    assert "sync" in agg["arms"] and "gap_vs_sync" not in sync


def test_merged_runs_must_have_the_same_settings(tmp_path: Path) -> None:
    settings = {"steps": 3, "prompts": 2, "group_size": 2, "lr": 1e-3, "max_new_tokens": 4,
                "eval_every": 1, "eval_size": 8, "tis_cap": 2.0, "levels": [1],
                "eval_metric": "expected", "kl_coef": 0.0, "max_grad_norm": 1.0}
    warm = {"base": "tiny", "steps": 20, "batch": 64, "lr": 3e-3, "seed": 0}
    old = [_seeded("sync", 0, 0, [0.1]), _seeded("gated", 4, 0, [0.1]),
           _seeded("ungated", 4, 0, [0.1]), _seeded("sync", 0, 1, [0.2])]
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"settings": settings | {"lag": 4}, "warmup": warm, "arms": old}))
    got = merged_arms([p], settings, 4, warm, {"sync", "gated"}, {("sync", 1)})
    assert [(a["arm"], a["seed"]) for a in got] == [("sync", 0), ("gated", 0)]
    with pytest.raises(ValueError, match="lr"):
        merged_arms([p], settings | {"lr": 3e-4}, 4, warm, {"sync"}, set())
    with pytest.raises(ValueError, match="lag"):
        merged_arms([p], settings, 8, warm, {"sync"}, set())
    with pytest.raises(ValueError, match=r"warmup\.steps"):
        merged_arms([p], settings, 4, warm | {"steps": 300}, {"sync"}, set())
    with pytest.raises(ValueError, match="levels"):
        merged_arms([p], settings | {"levels": [1, 2]}, 4, warm, {"sync"}, set())
    with pytest.raises(ValueError, match="eval_metric"):
        merged_arms([p], settings | {"eval_metric": "sampled"}, 4, warm, {"sync"}, set())
    with pytest.raises(ValueError, match="kl_coef"):
        merged_arms([p], settings | {"kl_coef": 0.1}, 4, warm, {"sync"}, set())
    with pytest.raises(ValueError, match="max_grad_norm"):
        merged_arms([p], settings | {"max_grad_norm": 0.5}, 4, warm, {"sync"}, set())


def test_runs_written_before_levels_and_eval_metric_count_as_all_levels_sampled(tmp_path: Path) -> None:
    legacy = {"steps": 3, "prompts": 2, "group_size": 2, "lr": 1e-3, "max_new_tokens": 4,
              "eval_every": 1, "eval_size": 8, "tis_cap": 2.0}
    warm = {"base": "tiny", "steps": 20, "batch": 64, "lr": 3e-3, "seed": 0}
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"settings": legacy | {"lag": 4}, "warmup": warm,
                             "arms": [_seeded("sync", 0, 0, [0.1])]}))
    now = legacy | {"levels": [1, 2, 3], "eval_metric": "sampled", "kl_coef": 0.0,
                    "max_grad_norm": 1.0}
    assert len(merged_arms([p], now, 4, warm, {"sync"}, set())) == 1
    with pytest.raises(ValueError, match="levels"):
        merged_arms([p], now | {"levels": [1]}, 4, warm, {"sync"}, set())
    with pytest.raises(ValueError, match="kl_coef"):  # older runs had no KL term
        merged_arms([p], now | {"kl_coef": 0.1}, 4, warm, {"sync"}, set())


def test_arms_option_selects_a_subset_and_always_keeps_sync() -> None:
    import argparse

    from rollbank_bench.learning.command import add_arguments, plan

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    arms, _ = plan(parser.parse_args(["--arms", "gated", "--sweep-lags", "8"]))
    assert [a["name"] for a in arms] == ["sync", "gated", "ungated-lag8"]
    assert [a["name"] for a in plan(parser.parse_args([]))[0]] == ["sync", "gated", "ungated"]
    with pytest.raises(ValueError, match="unknown"):
        plan(parser.parse_args(["--arms", "sync,fast"]))


def test_default_setting_is_level_1_with_the_expected_eval_and_quick_stays_small() -> None:
    import argparse

    from rollbank_bench.learning.command import LR, STEPS, add_arguments, plan

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    _, s = plan(parser.parse_args([]))
    assert (s["levels"], s["eval_metric"], s["lr"], s["steps"]) == ([1], "expected", LR, STEPS)
    _, q = plan(parser.parse_args(["--quick"]))
    assert (q["steps"], q["prompts"], q["group_size"], q["eval_size"]) == (3, 4, 4, 16)
    _, m = plan(parser.parse_args(["--levels", "1,2,3", "--eval-metric", "sampled"]))
    assert (m["levels"], m["eval_metric"]) == ([1, 2, 3], "sampled")


def test_kl_coef_and_grad_clip_reach_every_arms_trainer() -> None:
    import argparse

    from rollbank.staleness.config import CorrectionConfig, CorrectionMode
    from rollbank_bench.learning.arm import Settings, trainer_config
    from rollbank_bench.learning.command import KL_COEF, add_arguments, plan

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    _, default = plan(parser.parse_args([]))
    assert (default["kl_coef"], default["max_grad_norm"]) == (KL_COEF, 1.0)
    assert KL_COEF > 0  # the default anchors every arm to the warmed-up weights
    _, s = plan(parser.parse_args(["--kl-coef", "0.1", "--max-grad-norm", "0.5"]))
    assert (s["kl_coef"], s["max_grad_norm"]) == (0.1, 0.5)
    settings = Settings(**(s | {"seed": 3}))
    configs = [trainer_config(settings, CorrectionConfig(mode=mode), Path("/m"))
               for mode in (CorrectionMode.NONE, CorrectionMode.TOKEN_TIS)]
    for c in configs:  # the base (the warmed-up weights) is the reference of every arm
        assert (c.kl_coef, c.max_grad_norm, c.model, c.finetune) == (0.1, 0.5, "/m", "full")
        assert (c.lr, c.seed, c.micro_batch_size) == (settings.lr, 3, 64)
    assert [c.correction.mode for c in configs] == [CorrectionMode.NONE, CorrectionMode.TOKEN_TIS]
