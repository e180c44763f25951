"""The across-seed test of ``bench learning --engine vllm --seeds ...`` on recorded run docs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from rollbank_bench.learning import real_seeds


def _doc(seed: int, rewards: list[float], held: tuple[float, float], train: tuple[float, float]
         ) -> dict[str, Any]:
    return {"engine": "vllm", "model": "tiny (warmed up)", "settings": {"seed": seed},
            "final_version": len(rewards), "run_seconds": 1.0, "error": None,
            "steps": [{"version": k + 1, "reward_mean": r} for k, r in enumerate(rewards)],
            "summary": {"eval_start": held[0], "eval_final": held[1],
                        "train_tasks_eval_start": train[0], "train_tasks_eval_final": train[1]}}


def test_mean_se() -> None:
    assert real_seeds.mean_se([]) == {"n": 0, "mean": None, "se": None}
    assert real_seeds.mean_se([2.0]) == {"n": 1, "mean": 2.0, "se": None}
    one = real_seeds.mean_se([1.0, 2.0, 3.0])
    assert one["mean"] == 2.0 and one["se"] == pytest.approx(1.0 / 3 ** 0.5)


def test_seed_points_use_the_first_and_last_quarter() -> None:
    p = real_seeds.seed_points(_doc(0, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], (0.1, 0.2), (0.3, 0.4)))
    assert p["reward"]["window_steps"] == 2
    assert p["reward"]["start"] == pytest.approx(0.05) and p["reward"]["end"] == pytest.approx(0.65)
    assert p["held_out"] == {"start": 0.1, "end": 0.2}


def test_learned_needs_three_seeds_and_two_standard_errors(tmp_path: Path) -> None:
    rising = [_doc(s, [0.1, 0.1, 0.3, 0.3 + 0.01 * s], (0.2, 0.2), (0.2, 0.3 + 0.01 * s))
              for s in range(3)]
    test = real_seeds.learned_test([real_seeds.seed_points(d) for d in rising])
    assert test["reward"]["learned"] and test["train_tasks"]["learned"]
    assert not test["held_out"]["learned"]  # no change is not learning
    assert not real_seeds.learned_test([real_seeds.seed_points(d) for d in rising[:2]])["reward"]["learned"]
    noisy = [_doc(s, [0.2, 0.2, 0.2 + d, 0.2 + d], (0.2, 0.2), (0.2, 0.2))
             for s, d in enumerate((0.3, -0.25, 0.02))]
    assert not real_seeds.learned_test([real_seeds.seed_points(d) for d in noisy])["reward"]["learned"]
    assert "reward: end - start" in real_seeds.verdict(test)


def test_measure_seeds_runs_each_seed_in_its_own_folder(tmp_path: Path) -> None:
    seen: list[tuple[int, Path]] = []

    def run_one(args: argparse.Namespace) -> dict[str, Any]:
        seen.append((args.seed, args.out))
        return _doc(args.seed, [0.1, 0.2, 0.3, 0.4], (0.1, 0.1), (0.1, 0.2))

    args = argparse.Namespace(seed=None, out=tmp_path / "run", steps=4)
    doc = real_seeds.measure_seeds(args, [3, 4, 5], run_one)
    assert seen == [(s, tmp_path / "run" / f"seed-{s}") for s in (3, 4, 5)]
    assert [p["seed"] for p in doc["per_seed"]] == [3, 4, 5]
    assert doc["across_seeds"]["reward"]["diff"]["mean"] == pytest.approx(0.3)
    assert (tmp_path / "run" / "bench-learning-vllm-seeds.json").is_file()
    assert (tmp_path / "run" / doc["plot"]).is_file()
