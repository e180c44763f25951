"""`rollbank bench learning --quick`: the machinery runs end to end (a smoke test).

Real tiny model (warmed up for a few steps), real trainer, in-process sampler. Asserts that
every arm trains, records rewards and divergence per step, that the lagged arms measure a
non-zero divergence after the weights moved while the synchronous arm measures exactly 0, and
that the gated arm records the gate's decisions; it does not assert that anything is learned.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rollbank.bench.learning import command

pytestmark = pytest.mark.integration


def test_quick_runs_every_arm_and_records_divergence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLBANK_CACHE", str(tmp_path / "cache"))
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(["--quick", "--parallel", "1", "--out", str(tmp_path / "run")])
    doc = command.measure(args)

    arms = {a["arm"]: a for a in doc["arms"]}
    assert set(arms) == {"sync", "gated", "ungated"}
    for arm in arms.values():
        assert len(arm["steps"]) == 3
        assert len(arm["evals"]) == 4  # before training and after every step
        for step in arm["steps"]:
            assert 0.0 <= step["reward"] <= 1.0
            assert step["divergence"]["k3"] >= 0.0
            assert 0.0 < step["divergence"]["ess"] <= 1.0
    # sync: behaviour == current weights -> log rho exactly 0 on every token
    assert all(s["divergence"]["k3"] == 0.0 for s in arms["sync"]["steps"])
    # lag 1: from step 1 on the batch was sampled one update ago. Its divergence is non-zero
    # exactly when that update moved the weights (a step whose groups all have zero reward
    # variance has zero advantages, so zero gradient and unchanged weights).
    for name in ("gated", "ungated"):
        steps = arms[name]["steps"]
        assert [s["lag"] for s in steps] == [0, 1, 1]
        assert steps[0]["divergence"]["k3"] == 0.0  # lag 0 at step 0
        moved = steps[0]["grad_norm"] > 0.0
        assert (steps[1]["divergence"]["max_abs_log_rho"] > 0.0) == moved
    gate = arms["gated"]["gate_totals"]
    assert gate["trajectories"] == 3 * 4 * 4
    assert gate["admitted"] + gate["downweighted"] + gate["retried"] + gate["excluded"] == gate["trajectories"]
    assert all(s["gate"] is not None for s in arms["gated"]["steps"])
    assert arms["ungated"]["gate_totals"] is None

    run = tmp_path / "run"
    saved = json.loads((run / "bench-learning.json").read_text())
    assert {s["arm"] for s in saved["summaries"]} == {"sync", "gated", "ungated"}
    for png in ("reward_vs_samples.png", "reward_vs_wall.png", "divergence.png", "gate.png"):
        assert (run / png).stat().st_size > 0
