"""``bench learning --compare``: real-loop arms side by side, each against sync."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollbank_bench.learning.real_arms import compare, compare_files, parse_compare


def _doc(rewards_by_seed: dict[int, list[float]], age: int = 0, down: int = 0,
         lag: int | None = None, shift: float = 0.0) -> dict[str, Any]:
    """Batch rewards per seed; the eval of versions 0, 1, 2 is each seed's first reward, then
    its rewards shifted by ``shift`` (a trained policy better or worse than its batches)."""
    runs = [{"settings": {"seed": seed}, "stale_batches": 0, "run_seconds": 10.0,
             "steps": [{"reward_mean": r, "policy_age": min(k, age),
                        "gate": {"enabled": bool(down), "downweighted": down, "admitted": 30}}
                       for k, r in enumerate(rs)],
             "train_evals": [{"version": v, "solve_rate": (rs[0] if v == 0 else rs[v - 1] + shift)}
                             for v in range(len(rs) + 1)],
             "evals": [{"version": v, "solve_rate": 0.1} for v in range(len(rs) + 1)]}
            for seed, rs in rewards_by_seed.items()]
    return {"runs": runs, "seconds": 30.0, "verdict": "v", "settings": {"lag": lag}}


def test_each_arm_gets_its_rewards_age_and_gate_and_a_paired_test_against_sync() -> None:
    sync = _doc({0: [0.2, 0.3], 1: [0.2, 0.2], 2: [0.3, 0.3]})
    # batches as good as sync's, but a trained policy worse than its batches
    worse = _doc({0: [0.2, 0.3], 1: [0.2, 0.2], 2: [0.3, 0.3]}, age=4, lag=8, shift=-0.1)
    close = _doc({0: [0.1, 0.15], 1: [0.1, 0.1], 2: [0.2, 0.2]}, age=4, down=2, lag=8, shift=0.1)
    out = compare({"sync": sync, "ungated": worse, "gated": close})
    assert out["same_seeds"]
    s = out["arms"]["sync"]
    assert s["batch_reward"]["mean"] == pytest.approx((0.25 + 0.2 + 0.3) / 3)
    assert s["batch_reward"]["n"] == 3 and s["eval_versions"] == [0, 1, 2]
    assert s["train_tasks_auc"]["mean"] == pytest.approx((0.25 + 0.2 + 0.3) / 3)
    assert s["train_tasks_end"]["mean"] == pytest.approx((0.3 + 0.2 + 0.3) / 3)
    u = out["arms"]["ungated"]
    assert u["policy_age"] == {"mean": pytest.approx(0.5), "max": 1.0}
    v = u["vs_sync"]
    assert v["train_tasks_auc"]["measurably_worse"] and not v["train_tasks_auc"]["within_5pct_of_sync"]
    assert not v["batch_reward"]["measurably_worse"] and v["batch_reward"]["within_5pct_of_sync"]
    assert v["held_out_auc"]["paired_diff"]["mean"] == pytest.approx(0.0)
    g = out["arms"]["gated"]
    assert g["gate"]["enabled"] and g["gate"]["downweighted"] == 12 and g["gate"]["admitted"] == 180
    # behind on its (stale) batches, level on what its trained versions solve
    assert g["vs_sync"]["batch_reward"]["measurably_worse"]
    assert g["vs_sync"]["train_tasks_auc"]["within_5pct_of_sync"]
    assert not g["vs_sync"]["train_tasks_auc"]["measurably_worse"]
    assert "vs_sync" not in out["arms"]["sync"]
    assert s["run_seconds"] == pytest.approx(30.0)  # the seeds' own runs, not a re-evaluation's


def test_fewer_than_three_paired_seeds_never_count_as_measurably_worse() -> None:
    out = compare({"sync": _doc({0: [0.5], 1: [0.5]}), "ungated": _doc({0: [0.0], 1: [0.01]})})
    assert not out["arms"]["ungated"]["vs_sync"]["batch_reward"]["measurably_worse"]


def test_bad_compare_arguments_name_the_item_or_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'gated' is not NAME=FILE"):
        parse_compare("sync=a.json,gated")
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"arms": {}}))
    with pytest.raises(ValueError, match=r"gated=.*x\.json: not a bench-learning-vllm-seeds"):
        compare_files(f"gated={bad}")
    with pytest.raises(ValueError, match=r"sync=.*missing\.json"):
        compare_files(f"sync={tmp_path / 'missing.json'}")
    good = tmp_path / "s.json"
    good.write_text(json.dumps(_doc({0: [0.5]})))
    assert compare_files(f"sync={good}")["files"] == {"sync": str(good)}


def test_the_curves_and_the_figure(tmp_path: Path) -> None:
    from rollbank_bench.learning.real_arms import plot

    out = compare({"sync": _doc({0: [0.2, 0.4], 1: [0.2, 0.2]}),
                   "gated": _doc({0: [0.2, 0.3], 1: [0.2, 0.2]}, age=1, lag=4)})
    curve = out["arms"]["sync"]["train_tasks_curve"]
    assert [q["version"] for q in curve] == [0, 1, 2]
    assert curve[2]["mean"] == pytest.approx(0.3) and curve[2]["n"] == 2
    assert plot(out, tmp_path / "arms.png") == "arms.png"
    assert (tmp_path / "arms.png").stat().st_size > 0
