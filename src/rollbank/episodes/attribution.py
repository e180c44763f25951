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
- A command (the model's or the verifier's) that the host stalled beyond
  ``max_host_stall_s`` (billing's measurement) is ``infra_failure/host_stalled``.
- A verifier that times out, crashes or writes no reward, and a sandbox that dies, are
  decided by the experiment, never by a list of command patterns: the pristine fork fails
  the same way -> ``infra_failure``; the pristine fork verifies normally while the episode's
  sandbox still answers -> the model's state caused it (``model_failure``); the episode's
  sandbox is dead or silent while a pristine fork answers (the host can do that too) -> the
  REPLAY of the model's actions on a fresh fork decides: it breaks the fork -> the model's;
  the fork stays healthy -> infra (``sandbox_died`` / ``host_stalled``); the replay cannot
  run or is inconclusive, or the probes disagree -> ``unknown``.
- A verified failure (any verifiable end) with the episode's writable layer full is decided
  by the disk experiment: a fresh pristine fork cannot write a small file either -> the
  layer's filesystem is full for everyone (``infra_failure/disk_full``); it can -> the REPLAY
  of the model's actions on a fresh fork decides: that fork's layer fills too -> the model's
  (the verdict stands); it keeps room -> the host filled it (``disk_full``); the replay cannot
  run, is inconclusive, or the space cannot be read -> ``unknown``.
- Destructive-looking commands are recorded as a *hint* (``evidence.hint_destructive``) only.
- Forks the sandbox's process limit refused over its life (the kernel's count) are recorded
  as ``evidence.pids_limit_hits``; a command the model's own processes left no pid for is
  that command's result (exit 126), not a runtime failure (``sandbox/local/helper_failure.py``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from rollbank.episodes.experiment import (
    SLOW_FACTOR,
    SLOW_SHARE,
    DiskProbe,
    Experiment,
    Probe,
    ProbeState,
    ReplayEvidence,
    ReplayState,
    VerifierVerdict,
)
from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.sandbox.protocol import SandboxUsage

__all__ = ["SLOW_FACTOR", "SLOW_SHARE", "TIMED_OUT_ENDS", "VERIFIABLE", "DiskProbe", "Experiment",
           "LoopEnd", "Probe", "ProbeState", "ReplayEvidence", "ReplayState", "VerifierVerdict",
           "attribute", "death_reason", "destructive_commands", "disk_reason",
           "needs_disk_check", "needs_experiment", "needs_replay", "stall_reason", "stalled",
           "verifier_error_reason"]


class LoopEnd(StrEnum):
    """How the agent loop stopped (before the verifier)."""

    DONE = "done"  # the model declared it finished
    MAX_TURNS = "max_turns"
    BUDGET = "budget"  # per-episode time budget used up
    STEP_TIMEOUT = "step_timeout"  # a command timed out and the policy ends the episode
    CONTEXT = "context"  # the conversation no longer fits the model's context
    PROMPT_TOO_LONG = "prompt_too_long"  # the task's first prompt leaves no room: no model turn
    SANDBOX_DIED = "sandbox_died"
    SANDBOX_START_FAILED = "sandbox_start_failed"
    ENV_BUILD_FAILED = "env_build_failed"
    INFERENCE_ERROR = "inference_error"
    ABORTED = "aborted"
    HOST_ERROR = "host_error"  # an unexpected exception on rollbank's side
    AGENT_ERROR = "agent_error"  # an agent program (agents/) raised or was killed, all healthy
    AGENT_NO_MODEL_CALL = "agent_no_model_call"  # an agent program never got a model answer


# Loop ends after which the sandbox is still usable, so the verifier runs.
VERIFIABLE = frozenset(
    {LoopEnd.DONE, LoopEnd.MAX_TURNS, LoopEnd.BUDGET, LoopEnd.STEP_TIMEOUT, LoopEnd.CONTEXT}
)

_END_REASON: dict[LoopEnd, Reason] = {
    LoopEnd.MAX_TURNS: Reason.MAX_TURNS,
    LoopEnd.BUDGET: Reason.BUDGET_EXHAUSTED,
    LoopEnd.STEP_TIMEOUT: Reason.STEP_TIMEOUT,
    LoopEnd.CONTEXT: Reason.CONTEXT_EXHAUSTED,
    LoopEnd.PROMPT_TOO_LONG: Reason.PROMPT_EXCEEDS_CONTEXT,
    LoopEnd.SANDBOX_START_FAILED: Reason.SANDBOX_START_FAILED,
    LoopEnd.ENV_BUILD_FAILED: Reason.ENV_BUILD_FAILED,
    LoopEnd.INFERENCE_ERROR: Reason.INFERENCE_ERROR,
    LoopEnd.ABORTED: Reason.ABORTED,
    LoopEnd.HOST_ERROR: Reason.HOST_ERROR,
    LoopEnd.AGENT_ERROR: Reason.AGENT_ERROR,
    LoopEnd.AGENT_NO_MODEL_CALL: Reason.AGENT_NO_MODEL_CALL,
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


#: Loop ends after which a step timed out: the episode's sandbox is probed before verifying.
TIMED_OUT_ENDS = frozenset({LoopEnd.STEP_TIMEOUT, LoopEnd.BUDGET})

_SILENT = (ProbeState.DEAD, ProbeState.TIMED_OUT)  # the episode's sandbox stopped answering


def needs_experiment(end: LoopEnd, verdict: VerifierVerdict | None) -> bool:
    """The error paths (and only those) on which the experiment runs. A verifier the host
    stalled beyond the cap is measured evidence already (billing): no experiment."""
    if end is LoopEnd.SANDBOX_DIED:
        return True
    return verdict is not None and verdict.error not in (None, Reason.HOST_STALLED)


def stalled(exp: Experiment | None) -> bool:
    """After a step timeout: the episode's sandbox no longer answers (do not verify)."""
    return exp is not None and exp.episode is not None and not exp.episode.answered


def needs_replay(end: LoopEnd, exp: Experiment) -> bool:
    """Only a pristine fork answering while the episode's sandbox does not is ambiguous: the
    model broke it, or the host did (runtime crash, SIGKILL, host OOM killer, a local stall).
    Then, and only then, the model's actions are replayed on a fresh fork."""
    ep = exp.episode
    if ep is None:
        return False
    if exp.pristine_verdict is not None:  # a verifier error; the pristine re-verify is clean
        return ep.state in _SILENT and exp.pristine_verdict.error is None
    pristine_ok = exp.pristine is not None and exp.pristine.state is ProbeState.OK
    if end is LoopEnd.SANDBOX_DIED:
        return pristine_ok
    return pristine_ok and ep.state in _SILENT  # a step timed out and the sandbox hangs


def needs_disk_check(end: LoopEnd, verdict: VerifierVerdict | None) -> bool:
    """A verified failure (the verifier ran and said fail, on any verifiable end): the
    episode's writable layer is checked for free space (one read-only probe); only a full
    layer runs the disk experiment."""
    return (end in VERIFIABLE and verdict is not None and verdict.error is None
            and not verdict.passed)


def disk_reason(exp: Experiment) -> tuple[Reason | None, str] | None:
    """A verified failure with the episode's writable layer full: the host's or the model's?
    None: the layer is not full (or was not checked), the verdict stands. ``(None, why)``:
    the model's own doing, the verdict stands with ``why``. ``(reason, why)``: the verdict is
    replaced (``disk_full`` infra, or ``unattributed``)."""
    ep = exp.episode_disk
    if ep is None or not ep.full:
        return None
    what = f"the episode's writable layer is full ({ep.describe()})"
    p = exp.pristine_disk
    if p is None or p.full is None:
        why = p.detail if p is not None and p.detail else "not probed"
        return Reason.UNATTRIBUTED, f"{what}; a pristine fork's layer could not be checked: {why}"
    if p.full:
        return Reason.DISK_FULL, (f"{what}, and a fresh fork of the pristine snapshot cannot "
                                  f"write a small file either ({p.describe()}): the host's disk")
    what += f" while a fresh pristine fork writes ({p.describe()})"
    r = exp.replay
    if r is None or r.state is ReplayState.NOT_RUN:
        why = r.detail if r is not None and r.detail else "no replay ran"
        return Reason.UNATTRIBUTED, f"{what}; the model's actions could not be replayed: {why}"
    if r.state is ReplayState.INCONCLUSIVE:
        return Reason.UNATTRIBUTED, f"{what}; the replay was inconclusive: {r.detail}"
    if r.state is ReplayState.REPRODUCED:
        return None, (f"{what}; replaying the model's actions breaks a pristine fork after step "
                      f"{r.broke_after}: the model's doing")
    fd = r.fork_disk
    if fd is None or fd.full is None:
        why = fd.detail if fd is not None and fd.detail else "not probed"
        return Reason.UNATTRIBUTED, f"{what}; the replayed fork's space could not be read: {why}"
    if fd.full:
        return None, (f"{what}; replaying the model's {len(r.steps)} step(s) fills a pristine "
                      f"fork's layer too ({fd.describe()}): the model filled its own disk")
    return Reason.DISK_FULL, (f"{what}; the model's {len(r.steps)} replayed step(s) leave a "
                              f"pristine fork's layer with {fd.describe()}: the host filled it")


def _model_limits(usage: SandboxUsage | None) -> tuple[Reason, str] | None:
    if usage is not None and usage.memory_limit_hit:
        return Reason.MEMORY_EXCEEDED, "memory limit hit by the model's processes"
    if usage is not None and usage.pids_limit_hit:
        return Reason.PIDS_EXCEEDED, "process limit hit by the model's processes"
    return None


def _by_replay(usage: SandboxUsage | None, exp: Experiment | None, healthy: Reason,
               what: str) -> tuple[Reason, str]:
    """The episode's sandbox ``what`` while a pristine fork answers: the replay decides.
    Reproduced -> the model's (named by a limit hit if one explains it); the replayed fork
    stays healthy -> ``healthy`` (infra); not run or inconclusive -> unknown."""
    r = exp.replay if exp else None
    if r is None or r.state is ReplayState.NOT_RUN:
        why = r.detail if r and r.detail else "no replay ran"
        return Reason.UNATTRIBUTED, f"{what}; the model's actions could not be replayed: {why}"
    if r.state is ReplayState.INCONCLUSIVE:
        return Reason.UNATTRIBUTED, f"{what}; the replay was inconclusive: {r.detail}"
    if r.state is ReplayState.HEALTHY:
        n = len(r.steps)
        return healthy, (f"{what}, but the model's {n} replayed step(s) leave a pristine fork "
                         f"healthy{' (verified too)' if r.verified else ''}: not the model's doing")
    probe = r.fork_probe.state.value if r.fork_probe else "dead"
    how = (f"{what}; replaying the model's actions breaks a pristine fork the same way after "
           f"step {r.broke_after} ({probe})")
    if r.memory_limit_hit:
        return Reason.MEMORY_EXCEEDED, how + "; the model's processes hit the memory limit"
    if r.pids_limit_hit:
        return Reason.PIDS_EXCEEDED, how + "; the model's processes hit the process limit"
    hit = _model_limits(usage)
    return (hit[0], f"{how}; {hit[1]}") if hit else (Reason.SANDBOX_WRECKED, how)


def death_reason(usage: SandboxUsage | None, exp: Experiment | None) -> tuple[Reason, str]:
    """Why a sandbox died mid-episode: a pristine fork's probe, then the replay."""
    p = exp.pristine if exp else None
    if p is None or p.state is ProbeState.NOT_RUN:
        return Reason.UNATTRIBUTED, "sandbox died; no pristine fork could be probed"
    if p.state is not ProbeState.OK:
        return Reason.SANDBOX_DIED, f"a fresh fork of the pristine snapshot fails too ({p.state.value})"
    ep = exp.episode if exp else None
    what = "sandbox died" if ep is None or ep.state is not ProbeState.OK else \
        "runtime error (the sandbox still answers)"
    return _by_replay(usage, exp, Reason.SANDBOX_DIED,
                      f"{what} while a fresh fork of the pristine snapshot answers")


def stall_reason(exp: Experiment) -> tuple[Reason, str]:
    """After a step timeout the episode's sandbox does not answer: is the host stalled?"""
    p = exp.pristine
    if p is None or p.state is ProbeState.NOT_RUN:
        return Reason.UNATTRIBUTED, "episode sandbox does not answer; no pristine fork probed"
    if p.state is ProbeState.OK:
        return _by_replay(None, exp, Reason.HOST_STALLED,
                          "episode sandbox does not answer while a pristine fork does")
    return Reason.HOST_STALLED, f"episode and pristine sandboxes both fail the probe ({p.state.value})"


def verifier_error_reason(error: Reason, usage: SandboxUsage | None,
                          exp: Experiment | None) -> tuple[Reason, str]:
    """The verifier failed (``error``): re-verified on a pristine fork, who caused it?"""
    if error is Reason.HOST_STALLED:
        return error, "the host stalled the verifier beyond max_host_stall_s (measured, not billed)"
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
    if ep.state in _SILENT:  # dead or hanging: the host can do that too -> the replay decides
        healthy = Reason.SANDBOX_DIED if ep.state is ProbeState.DEAD else Reason.HOST_STALLED
        return _by_replay(usage, exp, healthy, (
            f"verifier failed ({error.value}) and the episode sandbox does not answer "
            f"({ep.state.value}) while the pristine fork verifies normally"))
    if ep.state is ProbeState.FAILED:  # it answers, but its commands fail: the model's state
        return _model_limits(usage) or (Reason.SANDBOX_WRECKED, (
            f"episode sandbox fails the probe ({ep.detail[-120:]}); pristine verifies normally"))
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
    if usage is not None and usage.pids_limit_hits_total:  # forks the sandbox's limit refused
        ev["pids_limit_hits"] = usage.pids_limit_hits_total
    if end is LoopEnd.SANDBOX_DIED and ev.get("node_lost"):
        return EpisodeOutcome.of(Reason.SANDBOX_DIED, attribution=(
            "the node hosting the sandbox was lost (its host actor died): not the model's doing"),
            **ev)
    if end is LoopEnd.SANDBOX_DIED:
        reason, why = death_reason(usage, experiment)
        return EpisodeOutcome.of(reason, attribution=why, **ev)
    if end is LoopEnd.HOST_ERROR and ev.get("host_stalled"):  # billing stopped a command
        return EpisodeOutcome.of(Reason.HOST_STALLED, attribution=(
            "the host stalled a command beyond max_host_stall_s (measured, not billed)"), **ev)
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
    disk = disk_reason(experiment) if experiment is not None else None
    if disk is not None:
        ev["attribution"] = disk[1]
        if disk[0] is not None:
            return EpisodeOutcome.of(disk[0], verifier_reward=verdict.reward, **ev)
    return EpisodeOutcome.of(reason, reward=verdict.reward, rewards=verdict.rewards, **ev)
