"""A verified failure with the writable layer full: the host's disk or the model's own?

The decision is pure (``attribution.disk_reason``): tested on evidence directly. The wiring
(runner -> ``Counterfactual.after_fail``: read-only free-space probe, a pristine fork's small
write, the replay with the fork's free space read after it) runs on fake sandboxes whose
"disk" is a handful of fake blocks: every byte a sandbox holds in files is one MiB used.

Regression: before the disk experiment, a verifier failure under a layer the HOST filled was
billed to the model (``model_failure verified_fail``, `rollbank bench faults` kind disk_full).
"""

from __future__ import annotations

from typing import Any

import pytest
from episode_rig import rig, script

from rollbank.episodes.attribution import (
    DiskProbe,
    Experiment,
    LoopEnd,
    ReplayEvidence,
    ReplayState,
    VerifierVerdict,
    attribute,
    disk_reason,
    needs_disk_check,
)
from rollbank.episodes.counterfactual import DISK_COMMAND, parse_disk
from rollbank.episodes.experiment import DISK_FULL_BYTES
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import Acquired
from rollbank.sandbox.fake import FakeBackend, FakeSandbox
from rollbank.tasks.model import Task

MIB = 1 << 20
FULL = DiskProbe(0, 100 * MIB)
ROOM = DiskProbe(60 * MIB, 100 * MIB)
FAIL = VerifierVerdict(0.0, {"reward": 0.0})


def _exp(pristine: DiskProbe | None = ROOM, replay: ReplayEvidence | None = None,
         episode: DiskProbe | None = FULL) -> Experiment:
    return Experiment(episode_disk=episode, pristine_disk=pristine, replay=replay)


def _healthy(fork: DiskProbe | None) -> ReplayEvidence:
    return ReplayEvidence(ReplayState.HEALTHY, steps=({"index": 0},), fork_disk=fork)


# ------------------------------------------------------------------ the pure decision
def test_disk_probe_full_semantics() -> None:
    assert DiskProbe(DISK_FULL_BYTES - 1).full is True
    assert DiskProbe(DISK_FULL_BYTES).full is False
    assert DiskProbe().full is None
    assert DiskProbe(0, wrote=True).full is False  # it wrote: there is room
    assert DiskProbe(0, wrote=False).full is True
    assert DiskProbe(50 * MIB, wrote=False).full is None  # failed for another reason


def test_only_a_verified_failure_checks_the_disk() -> None:
    assert needs_disk_check(LoopEnd.DONE, FAIL)
    assert needs_disk_check(LoopEnd.STEP_TIMEOUT, FAIL)
    assert not needs_disk_check(LoopEnd.DONE, VerifierVerdict(1.0, passed=True))
    assert not needs_disk_check(LoopEnd.DONE, VerifierVerdict(None, error=Reason.VERIFIER_CRASH))
    assert not needs_disk_check(LoopEnd.SANDBOX_DIED, None)


def test_a_layer_with_room_leaves_the_verdict() -> None:
    assert disk_reason(_exp(episode=ROOM)) is None
    assert disk_reason(_exp(episode=DiskProbe())) is None  # could not read: no experiment
    out = attribute(LoopEnd.DONE, verdict=FAIL, experiment=_exp(episode=ROOM))
    assert out.reason is Reason.VERIFIED_FAIL and "attribution" not in out.evidence


def test_a_pristine_fork_that_cannot_write_is_the_hosts_disk() -> None:
    out = attribute(LoopEnd.DONE, verdict=FAIL,
                    experiment=_exp(pristine=DiskProbe(0, 100 * MIB, wrote=False)))
    assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, Reason.DISK_FULL)
    assert "cannot write a small file either" in out.evidence["attribution"]
    assert out.reward is None and out.evidence["verifier_reward"] == 0.0


def test_a_replay_that_fills_a_fork_too_is_the_models() -> None:
    out = attribute(LoopEnd.DONE, verdict=FAIL, experiment=_exp(replay=_healthy(FULL)))
    assert (out.outcome, out.reason) == (Outcome.MODEL_FAILURE, Reason.VERIFIED_FAIL)
    assert "the model filled its own disk" in out.evidence["attribution"]
    out = attribute(LoopEnd.STEP_TIMEOUT, verdict=FAIL, experiment=_exp(replay=_healthy(FULL)))
    assert out.reason is Reason.STEP_TIMEOUT  # the loop's own reason stands


def test_a_replay_that_leaves_room_is_the_hosts() -> None:
    out = attribute(LoopEnd.DONE, verdict=FAIL, experiment=_exp(replay=_healthy(ROOM)))
    assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, Reason.DISK_FULL)
    assert "the host filled it" in out.evidence["attribution"]
    assert out.evidence["experiment"]["replay"]["fork_disk"]["free_bytes"] == 60 * MIB


def test_a_replay_that_breaks_the_fork_is_the_models() -> None:
    r = ReplayEvidence(ReplayState.REPRODUCED, broke_after=0)
    assert attribute(LoopEnd.DONE, verdict=FAIL, experiment=_exp(replay=r)).reason \
        is Reason.VERIFIED_FAIL


@pytest.mark.parametrize("exp", [
    _exp(pristine=None),
    _exp(pristine=DiskProbe(detail="pristine fork: SandboxStartError: no")),
    _exp(replay=None),
    _exp(replay=ReplayEvidence(ReplayState.NOT_RUN, detail="no fork")),
    _exp(replay=ReplayEvidence(ReplayState.INCONCLUSIVE, detail="cut by the replay cap")),
    _exp(replay=_healthy(None)),
    _exp(replay=_healthy(DiskProbe(detail="stat: not found"))),
])
def test_what_cannot_be_told_is_unknown(exp: Experiment) -> None:
    assert attribute(LoopEnd.DONE, verdict=FAIL, experiment=exp).outcome is Outcome.UNKNOWN


def test_parse_disk() -> None:
    d = parse_disk("wrote\nfree 10 4096 100\n", "", write=True)
    assert (d.free_bytes, d.total_bytes, d.wrote) == (40960, 409600, True)
    d = parse_disk("free 0 4096 100\n", "head: error writing: No space left on device", write=True)
    assert d.wrote is False and d.full is True and "No space" in d.detail
    assert parse_disk("", "stat: not found", write=False).full is None


# ------------------------------------------------------------------ through the runner
CAP_BLOCKS = 100  # every fake sandbox's "disk": 100 MiB


def _used(sb: FakeSandbox) -> int:
    return sum(len(v) for v in sb.files.values())  # one byte of a fake file = one MiB


def _stat(shared_full: bool) -> Any:
    def handler(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
        free = 0 if shared_full else max(0, CAP_BLOCKS - _used(sb))
        return 0, f"free {free} {MIB} {CAP_BLOCKS}\n".encode(), b""
    return handler


def _head(shared_full: bool) -> Any:
    def handler(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
        if shared_full or _used(sb) >= CAP_BLOCKS:
            return 1, b"", b"head: error writing 'standard output': No space left on device"
        return 0, b"", b""
    return handler


def _backend(shared_full: bool = False) -> FakeBackend:
    return FakeBackend(handlers={"stat": _stat(shared_full), "head": _head(shared_full)},
                       files={"/app/.keep": b""})


class HostFillsFirst:
    """The host fills the first sandbox it hands out (the episode's) to the brim."""

    name = "host-fills-first"

    def __init__(self, inner: WarmSource) -> None:
        self.inner, self.handed = inner, 0

    async def acquire(self, task: Task, *, budget_s: float | None) -> Acquired:
        acq = await self.inner.acquire(task, budget_s=budget_s)
        self.handed += 1
        if self.handed == 1:
            assert isinstance(acq.sandbox, FakeSandbox)
            acq.sandbox.files["/.rollbank-fill"] = b"\0" * CAP_BLOCKS
        return acq

    async def aclose(self) -> None:
        return None


FILL = "x" * CAP_BLOCKS  # the model's command writes its whole disk


async def _run(model: str, backend: FakeBackend, *, host_fills: bool = False) -> Any:
    async with rig(script(model, "DONE"), backend=backend) as r:
        if host_fills:
            assert isinstance(r.runner.source, WarmSource)
            src = HostFillsFirst(r.runner.source)
            r.runner.source = r.runner.judge.source = src
        t = await r.run()
        assert not r.backend.live  # the pristine fork and the replayed fork are closed
        return t.outcome, r.runner.judge.stats


async def test_runner_a_model_that_fills_its_own_disk_keeps_its_failure() -> None:
    out, stats = await _run(f"```bash\necho {FILL} > /app/fill\n```\n", _backend())
    assert (out.outcome, out.reason) == (Outcome.MODEL_FAILURE, Reason.VERIFIED_FAIL)
    exp = out.evidence["experiment"]
    assert exp["episode_disk"]["full"] and exp["pristine_disk"]["wrote"] is True
    assert exp["replay"]["state"] == "healthy" and exp["replay"]["fork_disk"]["full"]
    assert stats.replays == 1


async def test_runner_a_disk_the_host_filled_is_infra() -> None:
    # regression: was model_failure verified_fail (no disk experiment)
    out, _ = await _run("```bash\necho small > /app/note\n```\n", _backend(), host_fills=True)
    assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, Reason.DISK_FULL)
    assert out.evidence["experiment"]["replay"]["fork_disk"]["full"] is False


async def test_runner_a_shared_full_filesystem_is_infra_without_replay() -> None:
    out, stats = await _run("```bash\necho small > /app/note\n```\n", _backend(shared_full=True))
    assert (out.outcome, out.reason) == (Outcome.INFRA_FAILURE, Reason.DISK_FULL)
    assert out.evidence["experiment"]["pristine_disk"]["wrote"] is False
    assert stats.replays == 0


async def test_runner_a_normal_failure_pays_one_read_only_probe() -> None:
    out, stats = await _run("```bash\necho small > /app/note\n```\n", _backend())
    assert out.reason is Reason.VERIFIED_FAIL and "experiment" not in out.evidence
    assert (stats.disk_probes, stats.experiments) == (1, 0)


def test_the_episode_probe_is_read_only() -> None:
    assert ">" not in DISK_COMMAND and "rm" not in DISK_COMMAND
