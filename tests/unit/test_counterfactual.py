"""Counterfactual attribution through the runner, with fake sandboxes (decision wiring).

The verifier here reads the sandbox's state, so the episode's sandbox (changed by the
scripted model) and a fresh fork of the pristine snapshot answer differently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from episode_rig import make_task, rig, script

from rollbank.episodes.attribution import VerifierVerdict
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.episodes.validate import VerifyBaseline, baseline_path, load_baseline, save_baseline
from rollbank.errors import SandboxLostError
from rollbank.sandbox.fake import FakeBackend, FakeSandbox
from rollbank.sandbox.protocol import Sandbox
from rollbank.tasks.model import Task


class StateVerifier:
    """Times out if the model left /app/loop.py, crashes if it left /app/broken, else fails."""

    def __init__(self) -> None:
        self.calls = 0

    async def verify(self, sandbox: Sandbox, task: Task) -> VerifierVerdict:
        self.calls += 1
        if "loop" in (await sandbox.exec("cat /app/loop.py", timeout_s=5)).stdout:
            return VerifierVerdict(None, error=Reason.VERIFIER_TIMEOUT, duration_s=60.0)
        if "broken" in (await sandbox.exec("cat /app/broken", timeout_s=5)).stdout:
            return VerifierVerdict(None, error=Reason.VERIFIER_CRASH, detail="exit 127")
        return VerifierVerdict(0.0, {"reward": 0.0}, duration_s=0.5)


async def _run(model: str, **kw: Any) -> tuple[Trajectory, int]:
    async with rig(script(model, "DONE"), **kw) as r:
        v = StateVerifier()
        r.runner.verifier = v
        r.runner.judge.verifier = v
        t = await r.run()
        assert not r.backend.live  # the pristine fork is closed too
    return t, v.calls


async def test_a_loop_the_tests_call_is_the_models_failure() -> None:
    # regression (issue 8, defect 1): was infra_failure/verifier_timeout, re-run then dropped
    t, calls = await _run("```bash\necho loop > /app/loop.py\n```\n")
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE,
                                                      Reason.VERIFIER_TIMEOUT_MODEL_CAUSED)
    exp = t.outcome.evidence["experiment"]
    assert exp["episode_probe"]["state"] == "ok"
    assert exp["pristine_verify"]["error"] is None and exp["pristine_verify"]["reward"] == 0.0
    assert calls == 2  # the episode's verify + one pristine re-verify


async def test_a_broken_verifier_is_the_models_failure() -> None:
    # regression (issue 8, defect 1): a verifier crash (e.g. exit 127) was infra
    t, _ = await _run("```bash\necho broken > /app/broken\n```\n")
    assert t.outcome is not None
    assert t.outcome.reason is Reason.VERIFIER_BROKEN_BY_MODEL


async def test_the_normal_path_runs_no_experiment() -> None:
    t, calls = await _run("```bash\necho fine > /app/out.txt\n```\n")
    assert t.outcome is not None and t.outcome.reason is Reason.VERIFIED_FAIL
    assert calls == 1 and "experiment" not in t.outcome.evidence


def _kill_init(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
    sb.closed = True  # `kill -9 1`: the sandbox's init is gone
    return 137, b"", b""


async def test_a_sandbox_the_model_killed_is_wrecked_whatever_the_command() -> None:
    # regression (issue 8, defect 3): `kill -9 1` matched no pattern -> infra sandbox_died
    backend = FakeBackend(handlers={"kill": _kill_init}, files={"/app/.keep": b""})
    t, _ = await _run("```bash\nkill -9 1\n```\n", backend=backend)
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE, Reason.SANDBOX_WRECKED)
    assert t.outcome.evidence["experiment"]["pristine_probe"]["state"] == "ok"
    assert t.outcome.evidence["hint_destructive"] == ["kill -9 1"]


class FailingRecorder:
    async def record(self, traj: Trajectory, task: Task, meta: Any) -> None:
        raise RuntimeError("disk on fire")


async def test_a_recorder_error_does_not_change_the_outcome() -> None:
    # regression (issue 8, defect 7): the exception escaped run() -> driver's host_error
    async with rig(script("```bash\necho hello > /app/out.txt\n```\n", "DONE")) as r:
        r.runner.recorder = FailingRecorder()
        t = await r.run()
    assert t.outcome is not None and t.outcome.reason is Reason.VERIFIED_PASS
    assert t.meta["events"] == [{"event": "recorder_error", "error": "RuntimeError: disk on fire"}]


def test_task_declares_services_only_explicitly() -> None:
    assert make_task().services is False


class SlowStateVerifier(StateVerifier):
    async def verify(self, sandbox: Sandbox, task: Task) -> VerifierVerdict:
        v = await super().verify(sandbox, task)
        return v if v.error else VerifierVerdict(v.reward, v.rewards, duration_s=6.0)


async def test_the_validate_baseline_guards_against_a_slow_host(tmp_path: Path) -> None:
    save_baseline(VerifyBaseline("hash-hello", 1.0, 1.2, 600.0), tmp_path)
    assert load_baseline("hash-hello", tmp_path) == VerifyBaseline("hash-hello", 1.0, 1.2, 600.0)
    async with rig(script("```bash\necho loop > /app/loop.py\n```\n", "DONE")) as r:
        v = SlowStateVerifier()
        r.runner.verifier = r.runner.judge.verifier = v
        r.runner.judge.baseline_of = lambda h: load_baseline(h, tmp_path)
        t = await r.run()
    assert t.outcome is not None
    # the pristine re-verify took 6 s where tasks validate measured 1 s: too slow to judge
    assert t.outcome.outcome is Outcome.UNKNOWN
    assert t.outcome.evidence["experiment"]["baseline_verify_s"] == 1.0


def test_a_missing_or_corrupt_baseline_is_none(tmp_path: Path) -> None:
    assert load_baseline("nope", tmp_path) is None
    baseline_path("bad", tmp_path).write_text("{not json")
    assert load_baseline("bad", tmp_path) is None


def _lose_node(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
    sb.closed = True  # the node hosting the sandbox died under the command
    raise SandboxLostError("node 1234abcd lost during exec: ActorDiedError")


async def test_a_lost_node_is_infra_without_an_experiment() -> None:
    # regression (issue 14): a lost node went through the experiment, whose replay on this
    # host "reproduced" the death (the fake loses the pristine fork's node too): the model
    # was billed (sandbox_wrecked); a lost node is certain infra, re-run, never the model's
    backend = FakeBackend(handlers={"lose": _lose_node}, files={"/app/.keep": b""})
    t, calls = await _run("```bash\nlose\n```\n", backend=backend)
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE, Reason.SANDBOX_DIED)
    assert t.outcome.evidence["node_lost"] is True
    assert "experiment" not in t.outcome.evidence and calls == 0
