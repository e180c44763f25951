"""A sandbox the HOST stops (SIGSTOP of its processes) is not the model's step timeout.

Found by `rollbank bench faults` (kind ``sandbox_sigstop``): billing measures a frozen cgroup
and CPU starvation, not stopped tasks, so a command whose processes the host SIGSTOPs runs
into the step timeout billed to the model; the probe after it (a fresh process) answered,
so the episode was ``model_failure step_timeout``. The probe now reports a sandbox whose
processes are stopped as not answering, which runs the experiment: a pristine fork answers
and the model's replayed actions leave a fork healthy -> infra. Real sandboxes, the real
runner and experiment; a scripted model (fake inference: the model is not what is tested).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from pathlib import Path

import pytest

from rollbank.clock import FakeClock
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.harnesses import FencedShellHarness
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.runner import EpisodeRunner
from rollbank.episodes.sandboxes import Layers, TaskVerifier, WarmSource
from rollbank.episodes.sources import Acquired
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.protocol import GenerateRequest
from rollbank.routing.factory import make_router
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.pool import WarmPool
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec
from rollbank.tasks.config import BuilderConfig
from rollbank.tasks.loader import load_task
from rollbank.tasks.model import Task

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tasks" / "harbor-dockerfile-features"
INSTRUCTION = "Sigstop probe task: do as you are told."
TOK = FakeTokenizer()


def make_task(tmp_path: Path) -> Task:
    dst = tmp_path / "task"
    shutil.copytree(FIXTURE, dst)
    (dst / "instruction.md").write_text(INSTRUCTION + "\n")
    (dst / "tests" / "test.sh").write_text("echo 0 > /logs/verifier/reward.txt\n")
    (dst / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (dst / "task.toml").write_text("[verifier]\ntimeout_sec = 30.0\n")
    return load_task(dst)


class StopFirst:
    """A source whose first sandbox (the episode's) has every process SIGSTOPped by the host
    ``after_s`` after it is handed out."""

    name = "stop-first"

    def __init__(self, inner: WarmSource, after_s: float) -> None:
        self.inner, self.after_s, self.handed = inner, after_s, 0
        self.stops: list[asyncio.Task[None]] = []

    async def acquire(self, task: Task, *, budget_s: float | None) -> Acquired:
        acq = await self.inner.acquire(task, budget_s=budget_s)
        self.handed += 1
        if self.handed == 1:
            assert isinstance(acq.sandbox, LocalSandbox)
            self.stops.append(asyncio.create_task(self._stop(acq.sandbox)))
        return acq

    async def _stop(self, sb: LocalSandbox) -> None:
        await asyncio.sleep(self.after_s)
        for pid in sb.cgroup.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    async def aclose(self) -> None:
        return None


async def test_a_sandbox_the_host_sigstops_is_not_the_models_timeout(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    turns = ["```bash\nsleep 1.5; echo done\n```\n", "DONE"]

    def respond(req: GenerateRequest) -> str:
        k = TOK.decode(list(req.prompt_token_ids)).split(INSTRUCTION)[-1].count("\nOutput:")
        return turns[min(k, len(turns) - 1)]

    _, clients = make_fake_fleet(1, responder=respond)
    async with LocalBackend() as backend, WarmPool(backend) as pool:
        warm = WarmSource(pool, Layers(BuilderConfig.model_validate({})).spec)
        runner = EpisodeRunner(
            RunnerConfig(health_probe_timeout_s=2.0, max_turns=3, step_timeout_s=5.0,
                         step_timeout_ends_episode=True),
            tasks={task.task_id: task}, source=warm, verifier=TaskVerifier(),
            harness=FencedShellHarness(), tokenizer=TOK, clients={c.base_url: c for c in clients},
            router=make_router("round_robin", [c.base_url for c in clients], FakeClock()))
        stop = StopFirst(warm, after_s=0.3)
        runner.source = runner.judge.source = stop
        t = await runner.run(AttemptSpec(key=AttemptKey(0, 0, 0, "g0"), task_id=task.task_id,
                                         seed=1, group_size=1, launched_at=0.0))
    assert t.outcome is not None
    # was model_failure step_timeout: the host's SIGSTOP billed to the model
    assert t.outcome.outcome is Outcome.INFRA_FAILURE, t.outcome.to_dict()
    assert t.outcome.reason is Reason.HOST_STALLED, t.outcome.to_dict()
    exp = t.outcome.evidence["experiment"]
    assert exp["episode_probe"]["state"] == "timed_out" and "stopped" in exp["episode_probe"]["detail"]
    assert exp["replay"]["state"] == "healthy"
    assert all(s.done() for s in stop.stops)
