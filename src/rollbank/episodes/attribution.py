"""Who is to blame: pure rules that turn how an episode ended into one :class:`EpisodeOutcome`.

The runner reports *how the agent loop stopped* (:class:`LoopEnd`) and, when the verifier ran,
*what it said* (:class:`VerifierVerdict`). :func:`attribute` combines the two. No I/O here, so
every rule is unit-tested directly.

Rules (see ``episodes/outcome.py`` and docs/architecture.md)
- The model's own doing is ``model_failure`` even when it surfaces as a timeout, an exhausted
  budget, a full context, an out-of-memory or process-limit kill, or a sandbox it destroyed:
  a timeout is no escape from a penalty. When the verifier still passes, the model succeeded.
- Host-side faults (sandbox start/death without a model cause, inference errors, verifier
  crash/timeout/no reward on a healthy sandbox, rollbank's own abort) are ``infra_failure``.
- A sandbox that died or a verifier that crashed after the model ran a destructive command
  while the sandbox still answers a health probe cannot be attributed: ``unknown``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.sandbox.protocol import SandboxUsage


class LoopEnd(StrEnum):
    """How the agent loop stopped (before the verifier)."""

    DONE = "done"  # the model declared it finished
    MAX_TURNS = "max_turns"
    BUDGET = "budget"  # per-episode time budget used up
    STEP_TIMEOUT = "step_timeout"  # a command timed out and the policy ends the episode
    CONTEXT = "context"  # the conversation no longer fits the model's context
    SANDBOX_DIED = "sandbox_died"
    SANDBOX_START_FAILED = "sandbox_start_failed"
    ENV_BUILD_FAILED = "env_build_failed"
    INFERENCE_ERROR = "inference_error"
    ABORTED = "aborted"
    HOST_ERROR = "host_error"  # an unexpected exception on rollbank's side


# Loop ends after which the sandbox is still usable, so the verifier runs.
VERIFIABLE = frozenset(
    {LoopEnd.DONE, LoopEnd.MAX_TURNS, LoopEnd.BUDGET, LoopEnd.STEP_TIMEOUT, LoopEnd.CONTEXT}
)

_END_REASON: dict[LoopEnd, Reason] = {
    LoopEnd.MAX_TURNS: Reason.MAX_TURNS,
    LoopEnd.BUDGET: Reason.BUDGET_EXHAUSTED,
    LoopEnd.STEP_TIMEOUT: Reason.STEP_TIMEOUT,
    LoopEnd.CONTEXT: Reason.CONTEXT_EXHAUSTED,
    LoopEnd.SANDBOX_START_FAILED: Reason.SANDBOX_START_FAILED,
    LoopEnd.ENV_BUILD_FAILED: Reason.ENV_BUILD_FAILED,
    LoopEnd.INFERENCE_ERROR: Reason.INFERENCE_ERROR,
    LoopEnd.ABORTED: Reason.ABORTED,
    LoopEnd.HOST_ERROR: Reason.HOST_ERROR,
}

# Commands that destroy the sandbox they run in. Matching one is evidence of model cause.
_DESTRUCTIVE = [
    re.compile(p)
    for p in (
        r"\brm\s+(-\w*\s+)*-\w*[rR]\w*\s+(-\S+\s+)*(/|/\*|/(bin|usr|lib|etc|tests?))(\s|$|;|&)",
        r"--no-preserve-root",
        r"\bkill\s+(-\w+\s+)*-1\b",
        r"\bpkill\s+(-\w+\s+)*\.",
        r":\(\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:",  # the classic fork bomb
        r"\bmkfs(\.\w+)?\b",
        r"\bdd\s+.*\bof=/dev/",
        r"\bchmod\s+(-\w+\s+)*0*0{3}\s+/(\s|$)",
        r"\bmv\s+/(bin|usr|lib)\b",
    )
]


def destructive_commands(actions: Sequence[str | None]) -> list[str]:
    """The actions that match a known sandbox-destroying pattern."""
    return [a for a in actions if a and any(p.search(a) for p in _DESTRUCTIVE)]


@dataclass(frozen=True)
class VerifierVerdict:
    """What the verifier said, reduced to what attribution needs.

    ``error`` is one of the verifier infra reasons (crash, timeout, no reward) when the
    verifier itself failed; then ``reward`` is None.
    """

    reward: float | None
    rewards: dict[str, float] = field(default_factory=dict)
    passed: bool = False
    error: Reason | None = None
    detail: str = ""
    duration_s: float = 0.0


def death_reason(usage: SandboxUsage | None, actions: Sequence[str | None]) -> tuple[Reason, str]:
    """Why a sandbox died mid-episode: the model (limits hit, destructive command) or the host."""
    if usage is not None and usage.memory_limit_hit:
        return Reason.MEMORY_EXCEEDED, "memory limit hit by the model's processes"
    if usage is not None and usage.pids_limit_hit:
        return Reason.PIDS_EXCEEDED, "process limit hit by the model's processes"
    bad = destructive_commands(actions)
    if bad:
        return Reason.SANDBOX_WRECKED, f"destructive command: {bad[-1][:200]}"
    return Reason.SANDBOX_DIED, "sandbox runtime died with no model cause found"


def attribute(
    end: LoopEnd,
    *,
    verdict: VerifierVerdict | None = None,
    sandbox_healthy: bool = True,
    usage: SandboxUsage | None = None,
    actions: Sequence[str | None] = (),
    evidence: dict[str, Any] | None = None,
) -> EpisodeOutcome:
    """The one verdict on an episode. ``evidence`` is copied into the outcome."""
    ev: dict[str, Any] = {"loop_end": end.value, **(evidence or {})}
    if end is LoopEnd.SANDBOX_DIED:
        reason, why = death_reason(usage, actions)
        return EpisodeOutcome.of(reason, attribution=why, **ev)
    if end not in VERIFIABLE:
        return EpisodeOutcome.of(_END_REASON[end], **ev)
    if verdict is None:
        raise ValueError(f"loop end {end.value} needs a verifier verdict")
    ev["verifier_s"] = verdict.duration_s
    if verdict.detail:
        ev["verifier_detail"] = verdict.detail[-2000:]
    if verdict.error is not None:
        # The verifier failed. Did the model break what it needs?
        if not sandbox_healthy:
            reason, why = death_reason(usage, actions)
            if reason is Reason.SANDBOX_DIED:
                reason, why = Reason.SANDBOX_WRECKED, "sandbox failed its health probe after the agent ran"
            return EpisodeOutcome.of(reason, attribution=why, verifier_error=verdict.error.value, **ev)
        if destructive_commands(actions):
            return EpisodeOutcome.of(
                Reason.UNATTRIBUTED,
                attribution="verifier failed after a destructive command; sandbox still healthy",
                verifier_error=verdict.error.value,
                **ev,
            )
        return EpisodeOutcome.of(verdict.error, **ev)
    if verdict.passed:
        return EpisodeOutcome.of(
            Reason.VERIFIED_PASS, reward=verdict.reward, rewards=verdict.rewards, **ev
        )
    reason = Reason.VERIFIED_FAIL if end is LoopEnd.DONE else _END_REASON[end]
    return EpisodeOutcome.of(reason, reward=verdict.reward, rewards=verdict.rewards, **ev)
