"""The record of one attempt (episode): tokens, provenance, actions, outcome.

This is what crosses from the episode layer to the ready bank and the batch writer.

Invariants
- ``token_ids``, ``logprobs``, ``loss_mask`` and ``policy_versions`` have equal length; the
  first ``prompt_len`` tokens are the initial prompt (mask 0).
- A token with ``loss_mask == 1`` was sampled by the model; its ``logprobs`` entry is the
  behaviour log-prob and its ``policy_versions`` entry the weight version that sampled it, as
  the engine reported it for that token (one turn can span a weight update).
- A token with ``loss_mask == 0`` came from the environment or the prompt; its log-prob is 0.0
  and its version is -1.
- ``segment_starts`` (chat harness, gateway): offsets where a new segment begins, first 0;
  empty means one segment. A model token in the segment starting at ``s`` was conditioned on
  the tokens from ``s`` up to it only (a template that rewrote earlier turns, or an edited
  history, re-rendered the prompt as a new segment instead of re-tokenising in place).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rollbank.episodes.outcome import EpisodeOutcome

ENV_VERSION = -1


@dataclass
class StepRecord:
    """One agent turn: what the model said, the action parsed from it, what it observed."""

    index: int
    model_text: str
    action: str | None  # the command(s) parsed, None for a malformed or final turn
    observation: str  # what was fed back (possibly an error observation)
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    exec_s: float = 0.0
    inference_s: float = 0.0
    server: str | None = None
    finish_reason: str | None = None
    task_step: int | None = None  # the task step this turn belongs to (multi-step tasks only)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class TaskStepResult:
    """How one step of a multi-step task went (``episodes/steps.py``): its verdict and reward.

    ``reward`` is the step verifier's scalar (None when the verifier gave none); ``turns`` the
    model turns spent on the step, starting at turn index ``first_turn``.
    """

    index: int
    name: str
    reward: float | None
    rewards: dict[str, float]
    outcome: str
    reason: str
    loop_end: str | None
    first_turn: int
    turns: int
    passed_min_reward: bool
    verify_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "rewards": dict(self.rewards)}


@dataclass
class Trajectory:
    trajectory_id: str
    group_id: str
    task_id: str
    attempt: int  # sibling slot index within the group (0..n-1)
    retry: int = 0  # how many times this slot was re-run after an infra failure
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    prompt_len: int = 0
    segment_starts: list[int] = field(default_factory=list)  # [] = one segment from 0
    steps: list[StepRecord] = field(default_factory=list)
    outcome: EpisodeOutcome | None = None
    task_steps: list[TaskStepResult] = field(default_factory=list)  # multi-step tasks only
    # timings (seconds on the collector's clock)
    launched_at: float = 0.0
    started_at: float = 0.0  # sandbox ready
    finished_at: float = 0.0
    sandbox_setup_s: float = 0.0
    inference_s: float = 0.0
    tool_s: float = 0.0
    verify_s: float = 0.0
    # provenance for replay
    task_hash: str = ""
    layer_hashes: list[str] = field(default_factory=list)
    seed: int = 0
    servers: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def append_prompt(self, ids: list[int]) -> None:
        self.token_ids.extend(ids)
        self.logprobs.extend([0.0] * len(ids))
        self.loss_mask.extend([0] * len(ids))
        self.policy_versions.extend([ENV_VERSION] * len(ids))

    def append_model(self, ids: list[int], logprobs: list[float], version: int | Sequence[int]) -> None:
        """Model tokens; ``version`` is one per token (as the engine reported) or one for all."""
        versions = [version] * len(ids) if isinstance(version, int) else list(version)
        if not len(ids) == len(logprobs) == len(versions):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} logprobs and {len(versions)} versions")
        self.token_ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.loss_mask.extend([1] * len(ids))
        self.policy_versions.extend(versions)

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def reward(self) -> float | None:
        return self.outcome.reward if self.outcome else None

    @property
    def duration_s(self) -> float:
        return self.finished_at - self.launched_at

    @property
    def min_version(self) -> int:
        vs = [v for v in self.policy_versions if v != ENV_VERSION]
        return min(vs) if vs else ENV_VERSION

    @property
    def max_version(self) -> int:
        return max(self.policy_versions, default=ENV_VERSION)
