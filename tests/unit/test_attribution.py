"""Attribution rules: who is to blame for how an episode ended (pure; experiments as data)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rollbank.episodes.attribution import (
    Experiment,
    LoopEnd,
    Probe,
    ProbeState,
    ReplayEvidence,
    ReplayState,
    VerifierVerdict,
    attribute,
    death_reason,
    destructive_commands,
    needs_experiment,
    needs_replay,
)
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.sandbox.protocol import SandboxUsage

PASS = VerifierVerdict(1.0, {"reward": 1.0}, passed=True)
FAIL = VerifierVerdict(0.0, {"reward": 0.0}, passed=False)
CRASH = VerifierVerdict(None, error=Reason.VERIFIER_CRASH, detail="Traceback ...")


@pytest.mark.parametrize(
    ("end", "verdict", "reason"),
    [
        (LoopEnd.DONE, PASS, Reason.VERIFIED_PASS),
        (LoopEnd.DONE, FAIL, Reason.VERIFIED_FAIL),
        # the model's own timeout/budget/turns/context: a verified failure keeps that reason
        (LoopEnd.MAX_TURNS, FAIL, Reason.MAX_TURNS),
        (LoopEnd.BUDGET, FAIL, Reason.BUDGET_EXHAUSTED),
        (LoopEnd.STEP_TIMEOUT, FAIL, Reason.STEP_TIMEOUT),
        (LoopEnd.CONTEXT, FAIL, Reason.CONTEXT_EXHAUSTED),
        # ... and a timeout that still solved the task is a success
        (LoopEnd.BUDGET, PASS, Reason.VERIFIED_PASS),
    ],
)
def test_verifiable_ends(end: LoopEnd, verdict: VerifierVerdict, reason: Reason) -> None:
    out = attribute(end, verdict=verdict)
    assert out.reason is reason
    assert out.reward == verdict.reward
    assert out.evidence["loop_end"] == end.value


def test_model_timeouts_are_model_failures_never_infra() -> None:
    for end in (LoopEnd.BUDGET, LoopEnd.STEP_TIMEOUT, LoopEnd.MAX_TURNS, LoopEnd.CONTEXT):
        assert attribute(end, verdict=FAIL).outcome is Outcome.MODEL_FAILURE


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        (LoopEnd.SANDBOX_START_FAILED, Reason.SANDBOX_START_FAILED),
        (LoopEnd.ENV_BUILD_FAILED, Reason.ENV_BUILD_FAILED),
        (LoopEnd.INFERENCE_ERROR, Reason.INFERENCE_ERROR),
        (LoopEnd.ABORTED, Reason.ABORTED),
        (LoopEnd.HOST_ERROR, Reason.HOST_ERROR),
    ],
)
def test_host_side_ends_are_infra(end: LoopEnd, reason: Reason) -> None:
    out = attribute(end, evidence={"error": "boom"})
    assert out.reason is reason
    assert out.outcome is Outcome.INFRA_FAILURE
    assert out.evidence["error"] == "boom"
    assert not out.outcome.trainable


def test_verifiable_end_without_verdict_is_a_bug() -> None:
    with pytest.raises(ValueError, match="verdict"):
        attribute(LoopEnd.DONE)


OK = Probe(ProbeState.OK, 0.01)
FAILED = Probe(ProbeState.FAILED, 0.01, "exit 127")
HUNG = Probe(ProbeState.TIMED_OUT, 10.0)
DEAD = Probe(ProbeState.DEAD)
TIMEOUT = VerifierVerdict(None, error=Reason.VERIFIER_TIMEOUT, duration_s=60.0)


STEP = ({"index": 0, "wall_s": 0.1, "probe": "ok"},)
BROKE = ReplayEvidence(ReplayState.REPRODUCED, 1, "kill -9 -1", DEAD, 2, STEP)
HEALTHY = ReplayEvidence(ReplayState.HEALTHY, fork_probe=OK, steps_total=1, steps=STEP)
CUT = ReplayEvidence(ReplayState.INCONCLUSIVE, detail="cut by the replay cap (60.0 s)")
NO_FORK = ReplayEvidence(ReplayState.NOT_RUN, detail="pristine fork: SandboxStartError")


def exp(episode: Probe | None = OK, pristine: Probe | None = None,
        pv: VerifierVerdict | None = None, replay: ReplayEvidence | None = None,
        **kw: float) -> Experiment:
    return Experiment(episode=episode, pristine=pristine, pristine_verdict=pv,
                      verifier_timeout_s=kw.get("timeout", 60.0),
                      baseline_verify_s=kw.get("baseline"), replay=replay)


def test_sandbox_death_is_decided_by_the_replay() -> None:
    # regression (issue 8, defect 3): `kill -9 1` etc. matched no pattern -> infra sandbox_died
    for cmd in ("kill -9 1", "rm -rf /usr/*", "find / -delete", "chmod -R 000 /usr", "echo hi"):
        out = attribute(LoopEnd.SANDBOX_DIED, actions=[cmd],
                        experiment=exp(DEAD, pristine=OK, replay=BROKE))
        assert (out.outcome, out.reason) == (Outcome.MODEL_FAILURE, Reason.SANDBOX_WRECKED), cmd
        assert "after step 1" in out.evidence["attribution"]
        assert out.evidence["experiment"]["replay"]["broke_command"] == "kill -9 -1"
    # the same death when a pristine fork fails too: the host, not the model
    for broken in (DEAD, HUNG, FAILED):
        out = attribute(LoopEnd.SANDBOX_DIED, actions=["rm -rf /"],
                        experiment=exp(DEAD, pristine=broken))
        assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, Reason.SANDBOX_DIED)
        assert out.evidence["hint_destructive"] == ["rm -rf /"]  # kept, only as a hint
    # a runtime error while the sandbox still answers: the replay decides too
    out = attribute(LoopEnd.SANDBOX_DIED, experiment=exp(OK, pristine=OK, replay=BROKE))
    assert out.reason is Reason.SANDBOX_WRECKED
    assert "still answers" in out.evidence["attribution"]
    out = attribute(LoopEnd.SANDBOX_DIED, experiment=exp(OK, pristine=OK, replay=HEALTHY))
    assert out.reason is Reason.SANDBOX_DIED
    # no experiment possible: unknown
    out = attribute(LoopEnd.SANDBOX_DIED, experiment=exp(DEAD, pristine=Probe(ProbeState.NOT_RUN)))
    assert out.outcome is Outcome.UNKNOWN
    assert attribute(LoopEnd.SANDBOX_DIED).outcome is Outcome.UNKNOWN


def test_a_host_killed_sandbox_is_infra_when_the_replay_stays_healthy() -> None:
    # regression (flaw of the merged rules): a dead sandbox + an answering pristine fork was
    # always sandbox_wrecked (model), e.g. a runtime crash or a host SIGKILL of the anchor
    for probe in (DEAD, HUNG, FAILED, OK):
        out = attribute(LoopEnd.SANDBOX_DIED, actions=["echo hi"],
                        experiment=exp(probe, pristine=OK, replay=HEALTHY))
        assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, Reason.SANDBOX_DIED), probe
        assert "healthy" in out.evidence["attribution"]
        assert out.evidence["experiment"]["replay"]["steps"] == [dict(STEP[0])]
    # the replay cannot run, is cut by its cap, or was not given: unknown, never the model
    for replay in (CUT, NO_FORK, None):
        out = attribute(LoopEnd.SANDBOX_DIED, experiment=exp(DEAD, pristine=OK, replay=replay))
        assert (out.outcome, out.reason) == (Outcome.UNKNOWN, Reason.UNATTRIBUTED), replay
        assert "replay" in out.evidence["attribution"]


def test_limit_hits_name_the_reason_only_when_the_replay_reproduces() -> None:
    e = exp(DEAD, pristine=OK, replay=BROKE)
    assert death_reason(SandboxUsage(1.0, memory_limit_hit=True), e)[0] is Reason.MEMORY_EXCEEDED
    assert death_reason(SandboxUsage(1.0, pids_limit_hit=True), e)[0] is Reason.PIDS_EXCEEDED
    assert death_reason(None, exp(DEAD, pristine=OK, replay=replace(
        BROKE, memory_limit_hit=True)))[0] is Reason.MEMORY_EXCEEDED
    assert death_reason(SandboxUsage(1.0, memory_limit_hit=True),
                        exp(DEAD, pristine=DEAD))[0] is Reason.SANDBOX_DIED
    # an OOM kill the replay does not reproduce (the host's OOM killer): not the model's
    assert death_reason(SandboxUsage(1.0, memory_limit_hit=True),
                        exp(DEAD, pristine=OK, replay=HEALTHY))[0] is Reason.SANDBOX_DIED


def test_replay_runs_only_where_the_pristine_evidence_is_ambiguous() -> None:
    died = LoopEnd.SANDBOX_DIED
    assert needs_replay(died, exp(DEAD, pristine=OK)) and needs_replay(died, exp(HUNG, pristine=OK))
    assert not needs_replay(died, exp(DEAD, pristine=DEAD))  # infra already
    assert needs_replay(died, exp(OK, pristine=OK))  # a runtime error, the sandbox answers
    assert needs_replay(LoopEnd.STEP_TIMEOUT, exp(HUNG, pristine=OK))
    assert not needs_replay(LoopEnd.STEP_TIMEOUT, exp(HUNG, pristine=HUNG))
    # verifier errors: the clean pristine re-verify is the evidence unless the sandbox is silent
    assert not needs_replay(LoopEnd.DONE, exp(OK, pv=FAIL))
    assert not needs_replay(LoopEnd.DONE, exp(FAILED, pv=FAIL))
    assert not needs_replay(LoopEnd.DONE, exp(DEAD, pv=CRASH))  # pristine fails too
    assert needs_replay(LoopEnd.DONE, exp(DEAD, pv=FAIL)) and needs_replay(LoopEnd.DONE,
                                                                        exp(HUNG, pv=FAIL))


def test_host_stalled_commands_are_infra_without_an_experiment() -> None:
    stalled_v = VerifierVerdict(None, error=Reason.HOST_STALLED, detail="frozen")
    assert not needs_experiment(LoopEnd.DONE, stalled_v)
    out = attribute(LoopEnd.DONE, verdict=stalled_v)
    assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, Reason.HOST_STALLED)
    out = attribute(LoopEnd.HOST_ERROR, evidence={"host_stalled": True, "host_stall_s": 3.0})
    assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, Reason.HOST_STALLED)


def test_model_loop_called_by_the_tests_is_the_models_failure() -> None:
    # regression (issue 8, defect 1): a verifier timeout on a healthy sandbox was infra
    out = attribute(LoopEnd.DONE, verdict=TIMEOUT, experiment=exp(OK, pv=FAIL))
    assert (out.outcome, out.reason) == (Outcome.MODEL_FAILURE, Reason.VERIFIER_TIMEOUT_MODEL_CAUSED)
    assert out.evidence["experiment"]["pristine_verify"]["error"] is None
    assert out.evidence["verifier_error"] == "verifier_timeout"


def test_deleted_interpreter_is_the_models_failure() -> None:
    # regression (issue 8, defect 1): exit 127 without a reward was infra verifier_crash
    for pristine in (PASS, FAIL):
        out = attribute(LoopEnd.DONE, verdict=CRASH, actions=["rm -rf /usr/lib/python3*"],
                        experiment=exp(OK, pv=pristine))
        assert (out.outcome, out.reason) == (Outcome.MODEL_FAILURE, Reason.VERIFIER_BROKEN_BY_MODEL)
    no_reward = VerifierVerdict(None, error=Reason.VERIFIER_NO_REWARD)
    out = attribute(LoopEnd.DONE, verdict=no_reward, experiment=exp(OK, pv=FAIL))
    assert out.reason is Reason.VERIFIER_BROKEN_BY_MODEL


def test_verifier_failing_the_same_way_on_pristine_is_infra() -> None:
    for v in (CRASH, TIMEOUT, VerifierVerdict(None, error=Reason.VERIFIER_NO_REWARD)):
        assert v.error is not None
        out = attribute(LoopEnd.DONE, verdict=v, actions=["rm -rf /"], experiment=exp(OK, pv=v))
        assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, v.error)


def test_verifier_error_with_a_broken_episode_sandbox_is_wrecked() -> None:
    # the sandbox answers but its commands fail, the pristine fork verifies: the model's state
    out = attribute(LoopEnd.DONE, verdict=CRASH, experiment=exp(FAILED, pv=FAIL))
    assert (out.outcome, out.reason) == (Outcome.MODEL_FAILURE, Reason.SANDBOX_WRECKED)
    # a dead or silent episode sandbox: the replay decides
    for probe, healthy in ((DEAD, Reason.SANDBOX_DIED), (HUNG, Reason.HOST_STALLED)):
        out = attribute(LoopEnd.DONE, verdict=CRASH, experiment=exp(probe, pv=FAIL, replay=BROKE))
        assert (out.outcome, out.reason) == (Outcome.MODEL_FAILURE, Reason.SANDBOX_WRECKED)
        out = attribute(LoopEnd.DONE, verdict=CRASH, experiment=exp(probe, pv=FAIL, replay=HEALTHY))
        assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, healthy)
        out = attribute(LoopEnd.DONE, verdict=CRASH, experiment=exp(probe, pv=FAIL))
        assert out.outcome is Outcome.UNKNOWN


@pytest.mark.parametrize(
    ("experiment", "why"),
    [
        (None, "no experiment"),
        (Experiment(episode=OK, pristine_error="pristine fork: SandboxStartError"), "could not run"),
        (exp(OK, pv=CRASH), "differently"),  # timeout here, crash there
        (exp(HUNG, pv=FAIL), "does not answer"),  # a frozen sandbox or the model's hang
        (exp(OK, pv=replace(FAIL, duration_s=40.0)), "too slow"),  # >= half the timeout
        (exp(OK, pv=replace(FAIL, duration_s=9.0), baseline=1.0), "too slow"),  # 9x validate
    ],
)
def test_disagreeing_or_missing_experiments_are_unknown(experiment: Experiment | None,
                                                         why: str) -> None:
    out = attribute(LoopEnd.DONE, verdict=TIMEOUT, experiment=experiment)
    assert (out.outcome, out.reason) == (Outcome.UNKNOWN, Reason.UNATTRIBUTED)
    assert why in out.evidence["attribution"]


def test_a_fast_pristine_within_the_baseline_is_judged() -> None:
    out = attribute(LoopEnd.DONE, verdict=TIMEOUT,
                    experiment=exp(OK, pv=replace(FAIL, duration_s=3.0), baseline=1.0))
    assert out.reason is Reason.VERIFIER_TIMEOUT_MODEL_CAUSED
    assert out.evidence["experiment"]["baseline_verify_s"] == 1.0


def test_step_timeout_with_a_stalled_sandbox() -> None:
    # the sandbox answers after the timeout: the model's slow command, verified as usual
    assert attribute(LoopEnd.STEP_TIMEOUT, verdict=FAIL, experiment=exp(OK)).reason \
        is Reason.STEP_TIMEOUT
    # neither the episode's nor a pristine sandbox answers: the host stalled
    out = attribute(LoopEnd.STEP_TIMEOUT, experiment=exp(HUNG, pristine=HUNG))
    assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, Reason.HOST_STALLED)
    # only the episode's sandbox hangs: the replay tells the model's state from a local stall
    out = attribute(LoopEnd.BUDGET, experiment=exp(HUNG, pristine=OK))
    assert out.outcome is Outcome.UNKNOWN
    out = attribute(LoopEnd.BUDGET, experiment=exp(HUNG, pristine=OK, replay=HEALTHY))
    assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, Reason.HOST_STALLED)
    out = attribute(LoopEnd.STEP_TIMEOUT, experiment=exp(HUNG, pristine=OK, replay=BROKE))
    assert (out.outcome, out.reason) == (Outcome.MODEL_FAILURE, Reason.SANDBOX_WRECKED)
    assert needs_experiment(LoopEnd.DONE, CRASH) and not needs_experiment(LoopEnd.DONE, FAIL)
    assert needs_experiment(LoopEnd.SANDBOX_DIED, None)


@pytest.mark.parametrize(
    ("cmd", "bad"),
    [
        ("rm -rf /", True),
        ("rm -rf / --no-preserve-root", True),
        ("sudo rm -fr /*", True),
        (":(){ :|:& };:", True),
        ("kill -9 -1", True),
        ("kill -9 1", True),
        ("rm -rf /usr/*", True),
        ("rm -rf /usr/lib/python3*", True),
        ("find / -delete", True),
        ("chmod -R 000 /usr", True),
        ("rm -rf /tmp/build", False),
        ("kill -9 12345", False),
        ("rm -rf build/", False),
        ("rm -rf ./tmp", False),
        ("ls /", False),
        ("echo 'rm' > notes.txt", False),
    ],
)
def test_destructive_patterns(cmd: str, bad: bool) -> None:
    assert bool(destructive_commands([cmd])) is bad


def test_forks_refused_by_the_process_limit_are_evidence() -> None:
    # the kernel's count over the sandbox's life (e.g. a command the model's background
    # processes left no pid for): recorded with the verdict, which it does not change
    out = attribute(LoopEnd.DONE, verdict=FAIL, usage=SandboxUsage(1.0, pids_limit_hits_total=3))
    assert (out.outcome, out.reason) == (Outcome.MODEL_FAILURE, Reason.VERIFIED_FAIL)
    assert out.evidence["pids_limit_hits"] == 3
    assert "pids_limit_hits" not in attribute(LoopEnd.DONE, verdict=FAIL,
                                              usage=SandboxUsage(1.0)).evidence
