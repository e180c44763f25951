"""A verified failure under a full writable layer: the host's disk or the model's own?

Found by `rollbank bench faults` (kind ``disk_full``) once the verifier was pinned (private
/tests and /logs/verifier): a layer the HOST filled no longer breaks verification, so the
model's failure under it was billed to the model (``model_failure verified_fail``). The disk
experiment now decides: the episode's layer is full, a pristine fork writes, and replaying the
model's actions on a fresh fork either fills that fork's layer too (the model's) or leaves it
room (the host's: ``infra_failure disk_full``). Real sandboxes (bubblewrap, a 32 MiB tmpfs
layer), the real runner, experiment and pinned verifier; a scripted model (fake inference).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from rollbank.clock import FakeClock
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.harnesses import FencedShellHarness
from rollbank.episodes.outcome import Outcome
from rollbank.episodes.runner import EpisodeRunner
from rollbank.episodes.sandboxes import Layers, TaskVerifier, WarmSource
from rollbank.episodes.sources import Acquired
from rollbank.episodes.trajectory import Trajectory
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
INSTRUCTION = "Disk probe task: do as you are told."
TOK = FakeTokenizer()


def make_task(tmp_path: Path) -> Task:
    dst = tmp_path / "task"
    shutil.copytree(FIXTURE, dst)
    (dst / "instruction.md").write_text(INSTRUCTION + "\n")
    # passes only if the model left /app/done: the scripted model never does (a failure)
    (dst / "tests" / "test.sh").write_text(
        "if [ -f /app/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n")
    (dst / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    # 32 MiB writable layer, well under the memory limit its tmpfs pages are charged to
    (dst / "task.toml").write_text("[verifier]\ntimeout_sec = 30.0\n"
                                   "[environment]\nmemory_mb = 512\nstorage_mb = 32\n")
    return load_task(dst)


class HostFillsFirst:
    """The host fills the first sandbox it hands out (the episode's): its tmpfs layer is
    written to ENOSPC from outside, through /proc/<anchor>/root, as `bench faults` does."""

    name = "host-fills-first"

    def __init__(self, inner: WarmSource) -> None:
        self.inner, self.handed = inner, 0
        self.filled: list[int] = []

    async def acquire(self, task: Task, *, budget_s: float | None) -> Acquired:
        acq = await self.inner.acquire(task, budget_s=budget_s)
        self.handed += 1
        if self.handed == 1:
            assert isinstance(acq.sandbox, LocalSandbox)
            path = Path(f"/proc/{acq.sandbox.anchor_pid}/root/.rollbank-host-fill")
            self.filled.append(await asyncio.to_thread(_fill, path))
        return acq

    async def aclose(self) -> None:
        return None


def _fill(path: Path) -> int:
    n = 0
    with path.open("wb", buffering=0) as f:
        chunk = b"\0" * (1 << 16)
        while True:
            try:
                n += f.write(chunk) or 0
            except OSError:
                if len(chunk) == 1:
                    return n
                chunk = chunk[: len(chunk) // 16 or 1]


async def _run(tmp_path: Path, command: str, *, host_fills: bool) -> tuple[Trajectory, list[int]]:
    task = make_task(tmp_path)
    turns = [f"```bash\n{command}\n```\n", "DONE"]

    def respond(req: GenerateRequest) -> str:
        k = TOK.decode(list(req.prompt_token_ids)).split(INSTRUCTION)[-1].count("\nOutput:")
        return turns[min(k, len(turns) - 1)]

    _, clients = make_fake_fleet(1, responder=respond)
    filled: list[int] = []
    async with LocalBackend() as backend, WarmPool(backend) as pool:
        warm = WarmSource(pool, Layers(BuilderConfig.model_validate({})).spec)
        runner = EpisodeRunner(
            RunnerConfig(health_probe_timeout_s=5.0, max_turns=3, step_timeout_s=30.0),
            tasks={task.task_id: task}, source=warm, verifier=TaskVerifier(),
            harness=FencedShellHarness(), tokenizer=TOK, clients={c.base_url: c for c in clients},
            router=make_router("round_robin", [c.base_url for c in clients], FakeClock()))
        if host_fills:
            src = HostFillsFirst(warm)
            runner.source = runner.judge.source = src
            filled = src.filled
        t = await runner.run(AttemptSpec(key=AttemptKey(0, 0, 0, "g0"), task_id=task.task_id,
                                         seed=1, group_size=1, launched_at=0.0))
    return t, filled


async def test_a_model_that_fills_its_own_disk_keeps_its_failure(tmp_path: Path) -> None:
    t, _ = await _run(tmp_path, "head -c 100m /dev/zero > /app/fill; echo wrote",
                      host_fills=False)
    assert t.outcome is not None
    assert t.outcome.outcome is Outcome.MODEL_FAILURE, t.outcome.to_dict()
    assert t.outcome.reason.value == "verified_fail", t.outcome.to_dict()
    exp = t.outcome.evidence["experiment"]  # the experiment ran and found the model's doing
    assert exp["episode_disk"]["full"] and exp["pristine_disk"]["wrote"] is True
    assert exp["replay"]["fork_disk"]["full"] is True
    assert "filled its own disk" in t.outcome.evidence["attribution"]


async def test_a_disk_the_host_filled_is_infra(tmp_path: Path) -> None:
    t, filled = await _run(tmp_path, "echo note > /app/note; echo wrote", host_fills=True)
    assert filled and filled[0] > 16 << 20  # the host did fill the 32 MiB layer
    assert t.outcome is not None
    # was model_failure verified_fail: the host's full disk billed to the model
    assert t.outcome.outcome is Outcome.INFRA_FAILURE, t.outcome.to_dict()
    assert t.outcome.reason.value == "disk_full", t.outcome.to_dict()
    exp = t.outcome.evidence["experiment"]
    assert exp["episode_disk"]["free_bytes"] < 1 << 20
    assert exp["replay"]["state"] == "healthy" and exp["replay"]["fork_disk"]["full"] is False
