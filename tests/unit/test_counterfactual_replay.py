"""The attribution replay through the runner, with fake sandboxes: when the episode's sandbox
died (or stopped answering) while a pristine fork answers, the model's recorded actions are
re-run on a fresh fork; reproduced -> the model's, healthy -> infra, no replay -> unknown.

The fake backend's command handlers stand in for the host: ``work`` kills only the FIRST
sandbox it runs in (the episode's: a host SIGKILL mid-command), ``nuke`` kills every sandbox
(the model's own doing).
"""

from __future__ import annotations

from typing import Any

from episode_rig import rig, script

from rollbank.episodes.attribution import VerifierVerdict
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.sources import Acquired
from rollbank.episodes.verifier import VerifierStatus, classify, verifier_outcome
from rollbank.errors import SandboxError, SandboxStartError
from rollbank.sandbox.fake import FakeBackend, FakeSandbox
from rollbank.sandbox.protocol import ExecResult, Sandbox
from rollbank.tasks.model import Task


class HostKillsFirst:
    """A command handler that kills only the first sandbox it runs in (a host-caused death)."""

    def __init__(self) -> None:
        self.victim: FakeSandbox | None = None

    def __call__(self, sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
        if self.victim is None:
            self.victim = sb
            sb.closed = True
            return 137, b"", b""
        return 0, b"worked\n", b""


def _nuke(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
    sb.closed = True  # the model's command takes its sandbox down, wherever it runs
    return 137, b"", b""


def _backend() -> FakeBackend:
    return FakeBackend(handlers={"work": HostKillsFirst(), "nuke": _nuke},
                       files={"/app/.keep": b""})


HARMLESS = "```bash\necho hi > /app/a.txt\n```\n"


async def test_a_host_kill_after_harmless_commands_is_infra() -> None:
    # regression: a dead episode sandbox + an answering pristine fork was sandbox_wrecked
    async with rig(script(HARMLESS, "```bash\nwork\n```\n", "DONE"), backend=_backend()) as r:
        t = await r.run()
        assert not r.backend.live  # the replay's fork is closed too
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE, Reason.SANDBOX_DIED), \
        t.outcome.to_dict()
    replay = t.outcome.evidence["experiment"]["replay"]
    assert replay["state"] == "healthy" and replay["steps_run"] == replay["steps_total"] == 2
    assert [s["index"] for s in replay["steps"]] == [0, 1]
    assert all(s["probe"] == "ok" for s in replay["steps"])
    assert r.runner.judge.stats.replays == 1


async def test_the_models_own_kill_is_reproduced_and_names_the_step() -> None:
    async with rig(script(HARMLESS, "```bash\nnuke\n```\n", "DONE"), backend=_backend()) as r:
        t = await r.run()
        assert not r.backend.live
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE,
                                                      Reason.SANDBOX_WRECKED), t.outcome.to_dict()
    replay = t.outcome.evidence["experiment"]["replay"]
    assert (replay["state"], replay["broke_after"], replay["broke_command"]) == \
        ("reproduced", 1, "nuke")
    assert "after step 1" in t.outcome.evidence["attribution"]


class NoThirdFork:
    """Wraps a source: the third sandbox (the replay's fork) cannot start."""

    name = "no-third-fork"

    def __init__(self, inner: Any) -> None:
        self.inner, self.n = inner, 0

    async def acquire(self, task: Task, *, budget_s: float | None) -> Acquired:
        self.n += 1
        if self.n == 3:
            raise SandboxStartError("no fork for you")
        acq: Acquired = await self.inner.acquire(task, budget_s=budget_s)
        return acq

    async def aclose(self) -> None:
        return None


async def test_a_replay_that_cannot_run_is_unknown() -> None:
    async with rig(script(HARMLESS, "```bash\nwork\n```\n", "DONE"), backend=_backend()) as r:
        r.runner.source = r.runner.judge.source = NoThirdFork(r.runner.source)
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.UNKNOWN, Reason.UNATTRIBUTED)
    assert t.outcome.evidence["experiment"]["replay"]["state"] == "not_run"


async def test_a_replay_cut_by_its_cap_is_unknown() -> None:
    model = script("```bash\nsleep 0.5\n```\n", "```bash\nwork\n```\n", "DONE")
    async with rig(model, backend=_backend(), replay_cap_s=0.05) as r:
        t = await r.run()
        assert not r.backend.live
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.UNKNOWN, Reason.UNATTRIBUTED)
    replay = t.outcome.evidence["experiment"]["replay"]
    assert replay["state"] == "inconclusive" and "cap" in replay["detail"]
    assert replay["cap_s"] == 0.05


class DiesInVerify:
    """The verifier's run takes the sandbox down: on the first call only (the host), or
    whenever the model left /app/bomb (the model's state)."""

    def __init__(self) -> None:
        self.calls = 0

    async def verify(self, sandbox: Sandbox, task: Task) -> VerifierVerdict:
        self.calls += 1
        bomb = "bomb" in (await sandbox.exec("cat /app/bomb", timeout_s=5)).stdout
        if bomb or self.calls == 1:
            assert isinstance(sandbox, FakeSandbox)
            sandbox.closed = True
            raise SandboxError("runtime died during verification")
        return VerifierVerdict(0.0, {"reward": 0.0}, duration_s=0.1)


async def test_a_death_during_verification_is_replayed_with_the_verifier() -> None:
    for model, expected in ((HARMLESS, Reason.SANDBOX_DIED),
                            ("```bash\necho bomb > /app/bomb\n```\n", Reason.SANDBOX_WRECKED)):
        async with rig(script(model, "DONE"), backend=_backend()) as r:
            r.runner.verifier = r.runner.judge.verifier = DiesInVerify()
            t = await r.run()
            assert not r.backend.live
        assert t.outcome is not None
        assert t.outcome.reason is expected, t.outcome.to_dict()
        replay = t.outcome.evidence["experiment"]["replay"]
        assert replay["verified"] is True
        assert replay["broke_after"] == (None if expected is Reason.SANDBOX_DIED else "verify")


def test_a_verifier_command_the_host_stalled_is_host_stalled_not_a_crash() -> None:
    # regression: billing's host_stalled verifier (exit None, no reward) classified as a crash,
    # then judged by the experiment (a frozen sandbox's probe -> "failed" -> sandbox_wrecked)
    stalled = ExecResult(None, 9, "", "", 3.0, stall_s=3.0, host_stalled=True)
    r = classify(stalled, None, None)
    assert r.status is VerifierStatus.HOST_STALLED and r.reward is None
    assert verifier_outcome(r).reason is Reason.HOST_STALLED
