"""`rollbank bench learning --engine vllm --quick`: the addition family through the real loop.

A managed vLLM CPU server with the (briefly) warmed-up tiny model, the answer-line harness in
real sandboxes, the tasks' test.sh verifiers, the built-in trainer and the direct publisher:
two sync steps. Asserts the loop ran (versions in the Parquet batches advance with the
publications, rewards are recorded, every saved version is evaluated on the held-out set);
it does not assert that anything is learned (docs/learning.md has the measured run).

Sizes (for speed): the server starts eager (no torch.compile warm-up) and the held-out set is
4 tasks; the steps, groups and versions are the --quick ones.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rollbank_bench.learning import command
from rollbank_bench.learning.real_loop import measure_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.integration]


def test_quick_real_loop_advances_versions_and_evaluates(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(["--engine", "vllm", "--quick", "--levels", "1",
                              "--vllm-compile", "eager", "--eval-size", "4",
                              "--out", str(tmp_path / "run")])
    doc = measure_vllm(command.vllm_args(args))

    assert doc["final_version"] == doc["served_version"] == 2
    assert [s["version"] for s in doc["steps"]] == [1, 2]
    # sync: batch k was generated entirely by version k (the engine's tags, from the Parquet)
    assert [sorted(b["token_versions"]) for b in doc["batches"]] == [["0"], ["1"]]
    assert all(b["trajectories"] == 8 for b in doc["batches"])
    assert all(0.0 <= s["reward_mean"] <= 1.0 for s in doc["steps"])
    assert all(s["publication_s"] is not None for s in doc["steps"])
    assert [e["version"] for e in doc["evals"]] == [0, 1, 2]
    assert all(e["attempts"] == doc["eval_tasks"] for e in doc["evals"])
    assert (tmp_path / "run" / "bench-learning-vllm.json").is_file()
    assert (tmp_path / "run" / "reward_vs_version.png").is_file()
