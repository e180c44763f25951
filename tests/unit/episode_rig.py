"""Shared fakes for the episode-runner, replay and collector tests (not a test module).

A task whose verifier passes when /app/out.txt holds "hello", a scripted model (the fake
server answers ``turns[k]`` at turn k), and a rig wiring an :class:`EpisodeRunner` to fake
sandboxes in a warm pool and fake inference servers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbank.clock import FakeClock
from rollbank.episodes.attribution import VerifierVerdict
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.harnesses import FencedShellHarness
from rollbank.episodes.outcome import Reason
from rollbank.episodes.runner import EpisodeRunner
from rollbank.episodes.sandboxes import SpecOf, WarmSource, spec_for
from rollbank.episodes.trajectory import Trajectory
from rollbank.episodes.workload import TraceWorkload
from rollbank.inference.fake import FakeInferenceServer, FakeTokenizer, make_fake_fleet
from rollbank.inference.protocol import GenerateRequest
from rollbank.routing.factory import make_router
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool
from rollbank.sandbox.protocol import Sandbox, SandboxSpec
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec
from rollbank.tasks.model import Task, TaskFormat

TOK = FakeTokenizer()


def make_task(tid: str = "hello") -> Task:
    p = Path(f"/tmp/rollbank-test/{tid}")
    return Task(task_id=tid, path=p, format=TaskFormat.HARBOR, content_hash=f"hash-{tid}",
                instruction="Write hello to /app/out.txt.", dockerfile=None, context_dir=p,
                tests_dir=p / "tests", test_command="bash /tests/test.sh", solution=None,
                workdir="/app")


class FileVerifier:
    """Passes when /app/out.txt holds 'hello'; can be told to crash."""

    def __init__(self, *, crash: bool = False) -> None:
        self.crash = crash
        self.calls = 0

    async def verify(self, sandbox: Sandbox, task: Task) -> VerifierVerdict:
        self.calls += 1
        if self.crash:
            return VerifierVerdict(None, error=Reason.VERIFIER_CRASH, detail="Traceback")
        try:
            data = await sandbox.read_file("/app/out.txt")
        except FileNotFoundError:
            data = b""
        ok = data.strip() == b"hello"
        return VerifierVerdict(1.0 if ok else 0.0, {"reward": 1.0 if ok else 0.0}, passed=ok)


def script(*turns: str) -> Callable[[GenerateRequest], str | None]:
    """A model that says ``turns[k]`` at turn k (turn = observations seen so far)."""

    def respond(req: GenerateRequest) -> str:
        prompt = TOK.decode(list(req.prompt_token_ids))
        k = prompt.split("Task: Write hello")[-1].count("\nOutput:")
        return turns[min(k, len(turns) - 1)]

    return respond


@dataclass
class Rig:
    runner: EpisodeRunner
    backend: FakeBackend
    servers: list[FakeInferenceServer]
    verifier: FileVerifier
    recorded: list[Trajectory] = field(default_factory=list)

    async def run(self, slot: int = 0, seq: int = 0) -> Trajectory:
        key = AttemptKey(seq=seq, slot=slot, retry=0, group_id=f"g{seq}")
        return await self.runner.run(AttemptSpec(key=key, task_id="hello", seed=7 + slot,
                                                 group_size=2, launched_at=0.0))


class Recorder:
    def __init__(self, out: list[Trajectory]) -> None:
        self.out = out

    async def record(self, traj: Trajectory, task: Task, meta: Any) -> None:
        self.out.append(traj)


@contextlib.asynccontextmanager
async def rig(responder: Callable[[GenerateRequest], str | None], *, crash: bool = False,
              backend: FakeBackend | None = None, servers: int = 2,
              workload: TraceWorkload | None = None, task: Task | None = None,
              verifier: FileVerifier | None = None, **cfg: Any) -> AsyncIterator[Rig]:
    """``task`` must keep the id ``hello`` (what :meth:`Rig.run` launches)."""
    backend = backend or FakeBackend(files={"/app/.keep": b""})
    fakes, clients = make_fake_fleet(servers, responder=responder)
    task = task or make_task()
    async with WarmPool(backend) as pool:
        source = WarmSource(pool, fake_spec(("layer-a",)))
        verifier = verifier or FileVerifier(crash=crash)
        recorded: list[Trajectory] = []
        runner = EpisodeRunner(
            RunnerConfig(**cfg), tasks={"hello": task}, source=source, verifier=verifier,
            harness=FencedShellHarness(), tokenizer=TOK,
            clients={c.base_url: c for c in clients},
            router=make_router("round_robin", [c.base_url for c in clients], FakeClock()),
            recorder=Recorder(recorded), workload=workload,
        )
        yield Rig(runner, backend, fakes, verifier, recorded)


def fake_spec(hashes: tuple[str, ...]) -> SpecOf:
    """What a warm source needs: the task's spec (no layers: the fake backend ignores them)."""

    async def spec_of(task: Task) -> tuple[SandboxSpec, tuple[str, ...]]:
        return spec_for(task, None), hashes

    return spec_of


def hanging_shell_close() -> tuple[asyncio.Event, asyncio.Event, Callable[[], Awaitable[None]]]:
    """A shell close that hangs (a frozen shell's): ``entered`` is set when a close starts,
    which then waits for ``hold``; pass the callable as ``FakeBackend(shell_close=...)``."""
    entered, hold = asyncio.Event(), asyncio.Event()

    async def close() -> None:
        entered.set()
        await hold.wait()

    return entered, hold, close


async def cancel_while_closing(task: asyncio.Task[Any], entered: asyncio.Event) -> None:
    """Wait until ``task`` is closing a shell, cancel it there, and see it end cancelled."""
    waiting = asyncio.ensure_future(entered.wait())
    await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
    assert entered.is_set(), "it ended without closing a shell"
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return
    raise AssertionError("the task was not cancelled")
