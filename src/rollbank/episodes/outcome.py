"""How an episode ended: exactly one :class:`Outcome`, a :class:`Reason` code and evidence.

Invariants
- Every episode ends with exactly one outcome.
- ``INFRA_FAILURE`` and ``UNKNOWN`` never reach the gradient nor a group's baseline.
- The model's own timeout, budget exhaustion, or a sandbox it wrecked is ``MODEL_FAILURE``:
  a timeout is no escape from a penalty.
- What cannot be attributed is ``UNKNOWN``, never silently a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    MODEL_SUCCESS = "model_success"
    MODEL_FAILURE = "model_failure"
    INFRA_FAILURE = "infra_failure"
    UNKNOWN = "unknown"

    @property
    def trainable(self) -> bool:
        """Whether an episode with this outcome may enter the gradient and group baseline."""
        return self in (Outcome.MODEL_SUCCESS, Outcome.MODEL_FAILURE)


class Reason(StrEnum):
    """Closed vocabulary of reason codes. The outcome each implies is in :data:`REASON_OUTCOME`."""

    # model_success / model_failure decided by the verifier
    VERIFIED_PASS = "verified_pass"
    VERIFIED_FAIL = "verified_fail"
    # model_failure caused by the model's own actions
    STEP_TIMEOUT = "step_timeout"  # a command the model ran exceeded the per-step timeout
    BUDGET_EXHAUSTED = "budget_exhausted"  # per-episode time/token/turn budget used up
    MAX_TURNS = "max_turns"
    CONTEXT_EXHAUSTED = "context_exhausted"  # the conversation outgrew the model's context
    SANDBOX_WRECKED = "sandbox_wrecked"  # the model broke its own sandbox (a replay of its
    # actions on a pristine fork breaks that one too, or the sandbox answers with failures)
    MEMORY_EXCEEDED = "memory_exceeded"  # the model's processes hit the memory limit
    PIDS_EXCEEDED = "pids_exceeded"  # fork bomb contained by the process limit
    # decided by experiment (episodes/counterfactual.py): the verifier failed on the model's
    # state while a fresh fork of the pristine snapshot verified normally
    VERIFIER_TIMEOUT_MODEL_CAUSED = "verifier_timeout_model_caused"  # e.g. tests call its loop
    VERIFIER_BROKEN_BY_MODEL = "verifier_broken_by_model"  # crash / no reward (pytest removed...)
    # infra_failure
    SANDBOX_START_FAILED = "sandbox_start_failed"
    SANDBOX_DIED = "sandbox_died"  # dead runtime the model's replayed actions do not reproduce
    ENV_BUILD_FAILED = "env_build_failed"
    INFERENCE_ERROR = "inference_error"
    VERIFIER_CRASH = "verifier_crash"
    VERIFIER_TIMEOUT = "verifier_timeout"
    VERIFIER_NO_REWARD = "verifier_no_reward"
    HOST_ERROR = "host_error"
    ABORTED = "aborted"  # rollbank itself aborted the attempt (straggler policy)
    PROMPT_EXCEEDS_CONTEXT = "prompt_exceeds_context"  # the harness's first prompt for the task
    # leaves no room to generate in runner.max_model_len: the model never acted (configuration)
    HOST_STALLED = "host_stalled"  # a command stalled by the host beyond max_host_stall_s, or a
    # silent sandbox that a pristine fork (or the model's replayed actions) does not reproduce
    DISK_FULL = "disk_full"  # a failure with the writable layer full that the model's replayed
    # actions do not reproduce on a pristine fork, or that a pristine fork shares (the host's)
    AGENT_ERROR = "agent_error"  # an agent program (agents/) raised or was killed while the
    # gateway's and the sandbox's probes were healthy: the program's defect, not the model's
    AGENT_NO_MODEL_CALL = "agent_no_model_call"  # an agent program that got no model answer
    # (never called the model, or only sent malformed requests): nothing the model did
    # unknown
    UNATTRIBUTED = "unattributed"


REASON_OUTCOME: dict[Reason, Outcome] = {
    Reason.VERIFIED_PASS: Outcome.MODEL_SUCCESS,
    Reason.VERIFIED_FAIL: Outcome.MODEL_FAILURE,
    Reason.STEP_TIMEOUT: Outcome.MODEL_FAILURE,
    Reason.BUDGET_EXHAUSTED: Outcome.MODEL_FAILURE,
    Reason.MAX_TURNS: Outcome.MODEL_FAILURE,
    Reason.CONTEXT_EXHAUSTED: Outcome.MODEL_FAILURE,
    Reason.SANDBOX_WRECKED: Outcome.MODEL_FAILURE,
    Reason.MEMORY_EXCEEDED: Outcome.MODEL_FAILURE,
    Reason.PIDS_EXCEEDED: Outcome.MODEL_FAILURE,
    Reason.VERIFIER_TIMEOUT_MODEL_CAUSED: Outcome.MODEL_FAILURE,
    Reason.VERIFIER_BROKEN_BY_MODEL: Outcome.MODEL_FAILURE,
    Reason.SANDBOX_START_FAILED: Outcome.INFRA_FAILURE,
    Reason.SANDBOX_DIED: Outcome.INFRA_FAILURE,
    Reason.ENV_BUILD_FAILED: Outcome.INFRA_FAILURE,
    Reason.INFERENCE_ERROR: Outcome.INFRA_FAILURE,
    Reason.VERIFIER_CRASH: Outcome.INFRA_FAILURE,
    Reason.VERIFIER_TIMEOUT: Outcome.INFRA_FAILURE,
    Reason.VERIFIER_NO_REWARD: Outcome.INFRA_FAILURE,
    Reason.HOST_ERROR: Outcome.INFRA_FAILURE,
    Reason.ABORTED: Outcome.INFRA_FAILURE,
    Reason.HOST_STALLED: Outcome.INFRA_FAILURE,
    Reason.PROMPT_EXCEEDS_CONTEXT: Outcome.INFRA_FAILURE,
    Reason.DISK_FULL: Outcome.INFRA_FAILURE,
    Reason.AGENT_ERROR: Outcome.INFRA_FAILURE,
    Reason.AGENT_NO_MODEL_CALL: Outcome.INFRA_FAILURE,
    Reason.UNATTRIBUTED: Outcome.UNKNOWN,
}


@dataclass(frozen=True)
class EpisodeOutcome:
    """The single verdict on one episode.

    ``reward`` is the verifier's scalar (mean of reward.json entries) when the verifier ran;
    ``rewards`` keeps the named entries. ``evidence`` holds what a person needs to check the
    attribution: the step index, exit codes, signals, timings, error text.
    """

    outcome: Outcome
    reason: Reason
    reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        expected = REASON_OUTCOME[self.reason]
        if expected is not self.outcome:
            raise ValueError(
                f"reason {self.reason.value} implies {expected.value}, not {self.outcome.value}"
            )

    @classmethod
    def of(cls, reason: Reason, *, reward: float | None = None,
           rewards: dict[str, float] | None = None, **evidence: Any) -> EpisodeOutcome:
        """Build an outcome from its reason code (the outcome follows from the reason)."""
        return cls(REASON_OUTCOME[reason], reason, reward, dict(rewards or {}), dict(evidence))

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "reason": self.reason.value,
            "reward": self.reward,
            "rewards": dict(self.rewards),
            "evidence": dict(self.evidence),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeOutcome:
        return cls(Outcome(d["outcome"]), Reason(d["reason"]), d.get("reward"),
                   dict(d.get("rewards") or {}), dict(d.get("evidence") or {}))
