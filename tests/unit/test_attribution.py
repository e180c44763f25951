"""Attribution rules: who is to blame for how an episode ended."""

from __future__ import annotations

import pytest

from rollbank.episodes.attribution import (
    LoopEnd,
    VerifierVerdict,
    attribute,
    death_reason,
    destructive_commands,
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


def test_sandbox_death_attribution() -> None:
    assert death_reason(SandboxUsage(1.0, memory_limit_hit=True), [])[0] is Reason.MEMORY_EXCEEDED
    assert death_reason(SandboxUsage(1.0, pids_limit_hit=True), [])[0] is Reason.PIDS_EXCEEDED
    assert death_reason(None, ["ls", "rm -rf /"])[0] is Reason.SANDBOX_WRECKED
    assert death_reason(SandboxUsage(1.0), ["ls -la"])[0] is Reason.SANDBOX_DIED
    out = attribute(LoopEnd.SANDBOX_DIED, actions=["kill -9 -1"])
    assert (out.outcome, out.reason) == (Outcome.MODEL_FAILURE, Reason.SANDBOX_WRECKED)
    out = attribute(LoopEnd.SANDBOX_DIED, actions=["echo hi"])
    assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, Reason.SANDBOX_DIED)


def test_verifier_crash_on_healthy_sandbox_is_infra() -> None:
    out = attribute(LoopEnd.DONE, verdict=CRASH, actions=["echo hi > out.txt"])
    assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, Reason.VERIFIER_CRASH)
    out = attribute(LoopEnd.DONE, verdict=VerifierVerdict(None, error=Reason.VERIFIER_TIMEOUT))
    assert out.reason is Reason.VERIFIER_TIMEOUT


def test_verifier_crash_on_wrecked_sandbox_is_the_models_fault() -> None:
    out = attribute(LoopEnd.DONE, verdict=CRASH, sandbox_healthy=False, actions=["rm -rf /usr"])
    assert (out.outcome, out.reason) == (Outcome.MODEL_FAILURE, Reason.SANDBOX_WRECKED)
    # unhealthy with no destructive pattern still means the agent broke it (it was healthy at start)
    out = attribute(LoopEnd.DONE, verdict=CRASH, sandbox_healthy=False, actions=["echo"])
    assert out.reason is Reason.SANDBOX_WRECKED


def test_unattributable_is_unknown() -> None:
    out = attribute(LoopEnd.DONE, verdict=CRASH, sandbox_healthy=True, actions=["rm -rf /tests"])
    assert (out.outcome, out.reason) == (Outcome.UNKNOWN, Reason.UNATTRIBUTED)


@pytest.mark.parametrize(
    ("cmd", "bad"),
    [
        ("rm -rf /", True),
        ("rm -rf / --no-preserve-root", True),
        ("sudo rm -fr /*", True),
        (":(){ :|:& };:", True),
        ("kill -9 -1", True),
        ("rm -rf build/", False),
        ("rm -rf ./tmp", False),
        ("ls /", False),
        ("echo 'rm' > notes.txt", False),
    ],
)
def test_destructive_patterns(cmd: str, bad: bool) -> None:
    assert bool(destructive_commands([cmd])) is bad
