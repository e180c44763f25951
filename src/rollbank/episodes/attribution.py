"""Who is to blame: pure rules that turn how an episode ended into one :class:`EpisodeOutcome`.

The runner reports *how the agent loop stopped* (:class:`LoopEnd`), *what the verifier said*
(:class:`VerifierVerdict`) and, on an error path only, the result of an *experiment*
(:class:`Experiment`, run by ``episodes/counterfactual.py``): a probe of the episode's sandbox
and the same check (verifier or probe) on a fresh fork of the task's pristine snapshot.
:func:`attribute` combines them. No I/O here, so every rule is unit-tested directly.

Rules (the table in docs/collect.md)
- The model's own doing is ``model_failure`` even when it surfaces as a timeout, an exhausted
  budget, a full context, an out-of-memory or process-limit kill, or a sandbox it destroyed.
  When the verifier still passes, the model succeeded.
- A verifier that times out, crashes or writes no reward, and a sandbox that dies, are
  decided by the experiment, never by a list of command patterns: the pristine fork verifies
  (answers) normally -> the model's state caused it (``model_failure``); the pristine fork
  fails the same way -> ``infra_failure``; the probes disagree or cannot run -> ``unknown``.
- Destructive-looking commands are recorded as a *hint* (``evidence.hint_destructive``) only.
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

# Commands that look like they destroy the sandbox they run in: a hint in the record, never
# the decision (the experiment decides).
_DESTRUCTIVE = [
    re.compile(p)
    for p in (
        r"\brm\s+(-\w*\s+)*-\w*[rR]\w*\s+(-\S+\s+)*/(\*|(bin|usr|lib\w*|etc|tests?|sbin)(/\S*)?)?(\s|$|;|&)",
        r"--no-preserve-root",
        r"\bkill\s+(-\w+\s+)*-1\b",
        r"\bkill\s+(-\w+\s+)*1\b",
        r"\bfind\s+/\S*\s.*-delete\b",
        r"\bchmod\s+(-\w+\s+)*[0-7]*0{3}\s+/\S*",
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

    def to_dict(self) -> dict[str, Any]:
        return {"reward": self.reward, "passed": self.passed,
                "error": self.error.value if self.error else None,
                "duration_s": round(self.duration_s, 3), "detail": self.detail[-500:]}


class ProbeState(StrEnum):
    """What a trivial command under a short deadline found."""

    OK = "ok"  # answered, exit 0
    FAILED = "failed"  # answered, but the command failed (missing shell, permissions...)
    TIMED_OUT = "timed_out"  # no answer within the deadline (a stall, or a hang)
    DEAD = "dead"  # the runtime is gone (or a fresh fork could not even start)
    NOT_RUN = "not_run"  # the experiment was not possible (no pristine source)


@dataclass(frozen=True)
class Probe:
    state: ProbeState
    duration_s: float = 0.0
    detail: str = ""

    @property
    def answered(self) -> bool:
        return self.state in (ProbeState.OK, ProbeState.FAILED)

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state.value, "duration_s": round(self.duration_s, 3),
                "detail": self.detail[-500:]}


#: A verifier timeout is not judged when the pristine re-verify itself used this share of
#: the timeout, or ran this many times slower than ``tasks validate`` measured: the host is too
#: slow now to tell a model's loop from a slow machine.
SLOW_SHARE = 0.5
SLOW_FACTOR = 4.0


@dataclass(frozen=True)
class Experiment:
    """Evidence of the counterfactual experiment (what a person needs to check the verdict).

    ``episode``: probe of the episode's sandbox. ``pristine``: probe of a fresh fork of the
    task's pristine snapshot. ``pristine_verdict``: the verifier re-run on a fresh fork under
    the same limits (None if not run). ``baseline_verify_s``: the no-op verifier time
    recorded by ``tasks validate`` (None if the task was not validated on this machine).
    """

    episode: Probe | None = None
    pristine: Probe | None = None
    pristine_verdict: VerifierVerdict | None = None
    pristine_error: str | None = None  # why the re-verify could not run
    verifier_timeout_s: float | None = None
    baseline_verify_s: float | None = None
    cost_s: float = 0.0

    def host_slow(self) -> bool:
        """Was the pristine re-verify too slow to judge a verifier timeout by?"""
        v = self.pristine_verdict
        if v is None:
            return False
        if self.verifier_timeout_s and v.duration_s >= SLOW_SHARE * self.verifier_timeout_s:
            return True
        b = self.baseline_verify_s
        return b is not None and v.duration_s > SLOW_FACTOR * b + 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "episode_probe": self.episode.to_dict() if self.episode else None,
            "pristine_probe": self.pristine.to_dict() if self.pristine else None,
            "pristine_verify": self.pristine_verdict.to_dict() if self.pristine_verdict else None,
            "pristine_error": self.pristine_error,
            "verifier_timeout_s": self.verifier_timeout_s,
            "baseline_verify_s": self.baseline_verify_s,
            "host_slow": self.host_slow(),
            "cost_s": round(self.cost_s, 3),
        }


#: Loop ends after which a step timed out: the episode's sandbox is probed before verifying.
TIMED_OUT_ENDS = frozenset({LoopEnd.STEP_TIMEOUT, LoopEnd.BUDGET})


def needs_experiment(end: LoopEnd, verdict: VerifierVerdict | None) -> bool:
    """The error paths (and only those) on which the experiment runs."""
    return end is LoopEnd.SANDBOX_DIED or (verdict is not None and verdict.error is not None)


def stalled(exp: Experiment | None) -> bool:
    """After a step timeout: the episode's sandbox no longer answers (do not verify)."""
    return exp is not None and exp.episode is not None and not exp.episode.answered


def _model_limits(usage: SandboxUsage | None) -> tuple[Reason, str] | None:
    if usage is not None and usage.memory_limit_hit:
        return Reason.MEMORY_EXCEEDED, "memory limit hit by the model's processes"
    if usage is not None and usage.pids_limit_hit:
        return Reason.PIDS_EXCEEDED, "process limit hit by the model's processes"
    return None


def death_reason(usage: SandboxUsage | None, exp: Experiment | None) -> tuple[Reason, str]:
    """Why a sandbox died mid-episode, decided by the pristine fork's probe."""
    p = exp.pristine if exp else None
    if p is None or p.state is ProbeState.NOT_RUN:
        return Reason.UNATTRIBUTED, "sandbox died; no pristine fork could be probed"
    if p.state is not ProbeState.OK:
        return Reason.SANDBOX_DIED, f"a fresh fork of the pristine snapshot fails too ({p.state.value})"
    ep = exp.episode if exp else None
    if ep is not None and ep.state in (ProbeState.OK, ProbeState.TIMED_OUT):
        # a runtime error, yet the sandbox is not dead: it answers, or it hangs (a stall?)
        return Reason.UNATTRIBUTED, (f"runtime error while the episode sandbox probe is "
                                     f"{ep.state.value} and a pristine fork answers")
    hit = _model_limits(usage)
    if hit is not None:
        return hit
    return Reason.SANDBOX_WRECKED, (
        f"sandbox died while a fresh fork of the pristine snapshot answers ({p.duration_s:.2f} s)")


def stall_reason(exp: Experiment) -> tuple[Reason, str]:
    """After a step timeout the episode's sandbox does not answer: is the host stalled?"""
    p = exp.pristine
    if p is None or p.state is ProbeState.NOT_RUN:
        return Reason.UNATTRIBUTED, "episode sandbox does not answer; no pristine fork probed"
    if p.state is ProbeState.OK:
        return Reason.UNATTRIBUTED, ("episode sandbox does not answer while a pristine fork does: "
                                     "the model's state or a stall of this sandbox")
    return Reason.HOST_STALLED, f"episode and pristine sandboxes both fail the probe ({p.state.value})"


def verifier_error_reason(error: Reason, usage: SandboxUsage | None,
                          exp: Experiment | None) -> tuple[Reason, str]:
    """The verifier failed (``error``): re-verified on a pristine fork, who caused it?"""
    pv = exp.pristine_verdict if exp else None
    if exp is None or pv is None:
        why = exp.pristine_error if exp and exp.pristine_error else "no experiment ran"
        return Reason.UNATTRIBUTED, f"verifier failed; pristine re-verify could not run: {why}"
    if pv.error is error:
        return error, f"a fresh fork of the pristine snapshot fails the same way ({error.value})"
    if pv.error is not None:
        return Reason.UNATTRIBUTED, f"pristine fork fails differently ({pv.error.value} vs {error.value})"
    ep = exp.episode
    if ep is None or ep.state is ProbeState.NOT_RUN:
        return Reason.UNATTRIBUTED, "pristine verifies normally; the episode sandbox was not probed"
    if ep.state is ProbeState.TIMED_OUT:
        return Reason.UNATTRIBUTED, ("pristine verifies normally but the episode sandbox does not "
                                     "answer: the model's state or a stall of this sandbox")
    if ep.state is not ProbeState.OK:  # failed or dead: the model broke its sandbox
        return _model_limits(usage) or (Reason.SANDBOX_WRECKED, (
            f"episode sandbox fails the probe ({ep.state.value}); pristine verifies normally"))
    if error is Reason.VERIFIER_TIMEOUT:
        if exp.host_slow():
            return Reason.UNATTRIBUTED, (f"host too slow to judge: pristine re-verify took "
                                         f"{pv.duration_s:.2f} s")
        return Reason.VERIFIER_TIMEOUT_MODEL_CAUSED, (
            f"tests time out on the model's state; pristine verifies in {pv.duration_s:.2f} s")
    return Reason.VERIFIER_BROKEN_BY_MODEL, (
        f"verifier fails ({error.value}) on the model's state; pristine verifies normally")


def attribute(
    end: LoopEnd,
    *,
    verdict: VerifierVerdict | None = None,
    usage: SandboxUsage | None = None,
    actions: Sequence[str | None] = (),
    evidence: dict[str, Any] | None = None,
    experiment: Experiment | None = None,
) -> EpisodeOutcome:
    """The one verdict on an episode. ``evidence`` is copied into the outcome."""
    ev: dict[str, Any] = {"loop_end": end.value, **(evidence or {})}
    hints = destructive_commands(actions)
    if hints:
        ev["hint_destructive"] = [h[:200] for h in hints[-3:]]
    if experiment is not None:
        ev["experiment"] = experiment.to_dict()
    if end is LoopEnd.SANDBOX_DIED:
        reason, why = death_reason(usage, experiment)
        return EpisodeOutcome.of(reason, attribution=why, **ev)
    if end not in VERIFIABLE:
        return EpisodeOutcome.of(_END_REASON[end], **ev)
    if end in TIMED_OUT_ENDS and experiment is not None and stalled(experiment):
        reason, why = stall_reason(experiment)
        return EpisodeOutcome.of(reason, attribution=why, **ev)
    if verdict is None:
        raise ValueError(f"loop end {end.value} needs a verifier verdict")
    ev["verifier_s"] = verdict.duration_s
    if verdict.detail:
        ev["verifier_detail"] = verdict.detail[-2000:]
    if verdict.error is not None:
        reason, why = verifier_error_reason(verdict.error, usage, experiment)
        return EpisodeOutcome.of(reason, attribution=why, verifier_error=verdict.error.value, **ev)
    if verdict.passed:
        return EpisodeOutcome.of(
            Reason.VERIFIED_PASS, reward=verdict.reward, rewards=verdict.rewards, **ev
        )
    reason = Reason.VERIFIED_FAIL if end is LoopEnd.DONE else _END_REASON[end]
    return EpisodeOutcome.of(reason, reward=verdict.reward, rewards=verdict.rewards, **ev)
