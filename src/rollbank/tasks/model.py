"""A loaded task: the format-independent description every other layer uses.

Loaders (:mod:`rollbank.tasks.harbor`, :mod:`rollbank.tasks.tbench`) turn a task folder into a
:class:`Task`. The content hash covers every file of the folder, so an episode records exactly
which task it ran and builds are cached by it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class TaskFormat(StrEnum):
    HARBOR = "harbor"
    TERMINAL_BENCH_1 = "terminal-bench-1"


#: A step's reward gate: one threshold for the step's reward, or one per reward.json key.
MinReward = float | Mapping[str, float]


@dataclass(frozen=True)
class TaskStep:
    """One step of a multi-step (Harbor schema 1.1 ``[[steps]]``) task: ``steps/<name>/``.

    ``tests_dir`` is the step's own ``tests/`` (None: the task-level ``tests/`` alone);
    ``solution`` its ``solution/solve.sh`` (the oracle for this step); ``setup_dir`` its
    ``workdir/`` (merged into the working directory before the step, ``setup.sh`` run there).
    ``min_reward``: the trial stops after this step when its reward is below the threshold
    (a float, or per reward.json key). Timeouts/env fall back to the task's when unset.
    """

    name: str
    instruction: str
    tests_dir: Path | None
    solution: Path | None = None
    min_reward: MinReward | None = None
    agent_timeout_s: float | None = None
    verifier_timeout_s: float | None = None
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    artifacts: tuple[str, ...] = ()
    setup_dir: Path | None = None
    contributes_to_mean: bool = True


@dataclass(frozen=True)
class Task:
    """A task, whatever its on-disk format.

    Multi-step tasks (``steps`` non-empty, Harbor schema 1.1): the steps run in order in ONE
    sandbox (the environment is built once). For step i the runner sends
    ``steps[i].instruction``, then verifies with :meth:`for_step` (``for_step(i)`` is a
    single-step view: that step's instruction, tests — task-level ``tests/`` with the step's
    ``tests/`` written over it —, solution, timeouts and verifier env), records the step's
    reward, and stops early when the reward misses ``steps[i].min_reward``. The trial reward
    is the mean of the steps' rewards (``multi_step_reward_strategy = "mean"``, steps with
    ``contributes_to_mean = false`` left out, steps never run count 0) or the last step's
    (``"final"``). For a multi-step task ``instruction``/``tests_dir``/``solution`` are those
    of step 0; timeouts and ``verifier_env`` stay the task-level ones (the fallbacks of every
    step), so use ``for_step(i)`` to run or verify a step.

    Skills (``[environment] skills_dir``): ``skills_dir`` is the absolute path inside the
    environment where the skills are (each a folder with a ``SKILL.md``); when the task folder
    has ``environment/skills/`` (``skills_source``) the builder copies it there as the last
    layer, so the agent sees them at ``skills_dir``; ``skills`` lists (name, description) from
    each ``SKILL.md`` front matter for harnesses that mention them in the prompt.
    """

    task_id: str  # folder name, unique within a suite
    path: Path  # the task folder
    format: TaskFormat
    content_hash: str  # sha256 over the folder's files (relative path + bytes)
    instruction: str
    dockerfile: Path | None  # environment Dockerfile (None: base image only)
    context_dir: Path  # build context for COPY/ADD
    tests_dir: Path  # copied to /tests only after the agent finishes
    test_command: str  # what the verifier runs inside the sandbox (e.g. "bash /tests/test.sh")
    solution: Path | None  # oracle solution script
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    build_timeout_s: float = 600.0
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    allow_internet: bool = False
    # the verifier needs what the agent left running (a server on loopback): keep it; False:
    # every leftover agent process is killed before verification. Harbor: [environment] services
    services: bool = False
    workdir: str | None = None  # None: from the Dockerfile's last WORKDIR
    env: Mapping[str, str] = field(default_factory=dict)
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    difficulty: str | None = None
    category: str | None = None
    tags: tuple[str, ...] = ()
    steps: tuple[TaskStep, ...] = ()
    # --- added by the loaders (engineer A), additive ---
    cost: str | None = None  # [metadata] cost (e.g. "cheap", "expensive"), for listings
    docker_image: str | None = None  # [environment] docker_image (used when no Dockerfile)
    extra_test_files: tuple[tuple[str, Path], ...] = ()  # (name in /tests, host file), e.g. TB1 run-tests.sh
    solution_env: Mapping[str, str] = field(default_factory=dict)  # [solution] env
    extra: Mapping[str, object] = field(default_factory=dict)  # unknown config keys, kept verbatim
    warnings: tuple[str, ...] = ()  # non-fatal findings of the loader (unknown keys, ...)
    # --- Harbor schema 1.1 ---
    schema_version: str | None = None
    multi_step_reward_strategy: str = "mean"  # "mean" or "final"
    artifacts: tuple[str, ...] = ()  # paths copied out of the sandbox after the agent finished
    skills_dir: str | None = None  # where the skills are inside the environment
    skills_source: Path | None = None  # environment/skills/ of the task folder, copied to skills_dir
    skills: tuple[tuple[str, str], ...] = ()  # (name, description) of each skill

    @property
    def multi_step(self) -> bool:
        return bool(self.steps)

    def for_step(self, index: int) -> Task:
        """The single-step view of step ``index`` (what one step's agent run and verifier see)."""
        step = self.steps[index]
        base_tests = self.path / "tests"
        extra: tuple[tuple[str, Path], ...]
        if step.tests_dir is None:
            tests_dir, extra = base_tests, ()
        elif base_tests.is_dir():
            files = sorted(p for p in step.tests_dir.rglob("*") if p.is_file())
            tests_dir, extra = base_tests, tuple((p.relative_to(step.tests_dir).as_posix(), p) for p in files)
        else:
            tests_dir, extra = step.tests_dir, ()
        return dataclasses.replace(
            self, instruction=step.instruction, tests_dir=tests_dir, extra_test_files=extra,
            solution=step.solution,
            agent_timeout_s=step.agent_timeout_s or self.agent_timeout_s,
            verifier_timeout_s=step.verifier_timeout_s or self.verifier_timeout_s,
            verifier_env={**self.verifier_env, **step.verifier_env},
            artifacts=self.artifacts + step.artifacts, steps=())


def passes_min_reward(min_reward: MinReward | None, reward: float | None,
                      rewards: Mapping[str, float]) -> bool:
    """Whether a step's result clears its ``min_reward`` gate (no gate: always)."""
    if min_reward is None:
        return True
    if isinstance(min_reward, Mapping):
        return all(rewards.get(k, 0.0) >= v for k, v in min_reward.items())
    return reward is not None and reward >= min_reward
