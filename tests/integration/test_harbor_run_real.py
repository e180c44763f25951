"""``harbor run`` with rollbank as the environment provider, on real fixture tasks.

Runs the real Harbor CLI from ``.venv-harbor`` (built by scripts/setup.sh through
scripts/setup_harbor.sh; Harbor needs Python >= 3.12, the test venv is 3.11) with
``--env rollbank.integrations.harbor:RollbankEnvironment`` and checks each trial's reward
against the task's own published verdict: the oracle scores 1 on a valid task and 0 on
``fail-validate-oracle`` (its published solution is broken), the nop agent scores 0.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARBOR = ROOT / ".venv-harbor" / "bin" / "harbor"
FIXTURES = ROOT / "tests" / "fixtures" / "harbor-tasks"
ENV = "rollbank.integrations.harbor:RollbankEnvironment"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not HARBOR.exists(), reason=".venv-harbor is missing: run "
                       "scripts/setup_harbor.sh (needs a Python >= 3.12)"),
]


def _tasks(tmp_path: Path, names: dict[str, str]) -> Path:
    d = tmp_path / "tasks"
    d.mkdir()
    for name, folder in names.items():
        (d / name).symlink_to(FIXTURES / folder / name)
    return d


def _run(tasks: Path, agent: str, out: Path, *extra: str) -> dict[str, dict[str, float] | None]:
    env = {**os.environ, "HARBOR_TELEMETRY": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run([str(HARBOR), "run", "-p", str(tasks), "-a", agent, "-n", "3",
                           "--env", ENV, "-o", str(out), "-y", "-q", *extra],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rewards: dict[str, dict[str, float] | None] = {}
    for result in out.glob("*/*/result.json"):
        d = json.loads(result.read_text())
        exc = d.get("exception_info")
        assert exc is None, f"{result.parent.name}: {exc}"
        name = Path(d["config"]["task"]["path"]).name  # trial folder names are truncated
        rewards[name] = (d.get("verifier_result") or {}).get("rewards")
    return rewards


def test_oracle_rewards_are_the_tasks_own_verdicts(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, {"simple-task": "harbor-cookbook", "skills": "harbor-cookbook",
                              "fail-validate-oracle": "benchmark-template-ci"})
    rewards = _run(tasks, "oracle", tmp_path / "jobs")
    assert rewards == {"simple-task": {"reward": 1.0}, "skills": {"reward": 1.0},
                       "fail-validate-oracle": {"reward": 0.0}}


def test_nop_scores_zero_and_the_verifier_phase_can_run_pinned(tmp_path: Path) -> None:
    # public_network=false: loopback only, so the verifier phase runs pinned (rb-helper)
    tasks = _tasks(tmp_path, {"simple-task": "harbor-cookbook"})
    assert _run(tasks, "nop", tmp_path / "nop") == {"simple-task": {"reward": 0.0}}
    assert _run(tasks, "oracle", tmp_path / "pinned", "--ek", "public_network=false") == {
        "simple-task": {"reward": 1.0}}
