"""The real sandbox sources: warm (fork from a pool snapshot) and cold (build + start).

- :class:`WarmSource` keeps one ready snapshot per task in a
  :class:`~rollbank.sandbox.pool.WarmPool` and forks each episode's sandbox from it
  (environment set-up off the critical path: the optimized arm).
- :class:`ColdSource` builds the task's environment and starts a fresh sandbox per episode
  (the naive arm). With ``rebuild`` the task's layers are rebuilt in a private layer cache
  per episode (the shared base filesystem stays cached), as a ``docker build`` per episode
  without a layer cache would; the private cache is deleted when the sandbox closes.
- :class:`Layers` builds each task's environment once, lazily (cached by content hash).
- :func:`open_sandboxes` opens the backend, prepares the tasks it is told to (build and
  snapshot before the clock starts) and yields a :class:`~rollbank.episodes.sources.SandboxPlane`.

Invariants: every sandbox handed out is owned by the caller; leaving :func:`open_sandboxes`
closes the pool (its stock) and the backend (every sandbox it started).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rollbank.episodes.attribution import VerifierVerdict
from rollbank.episodes.config import SandboxSection
from rollbank.episodes.outcome import Reason
from rollbank.episodes.sources import Acquired, SandboxPlane
from rollbank.errors import SandboxError
from rollbank.sandbox.protocol import (
    DEFAULT_OUTPUT_LIMIT,
    CapacityFeed,
    ExecResult,
    Limits,
    PinnedExec,
    Sandbox,
    SandboxBackend,
    SandboxSpec,
    SandboxUsage,
    ShellSession,
    Snapshot,
)
from rollbank.tasks.builder import BuiltEnvironment, EnvironmentBuilder
from rollbank.tasks.config import BuilderConfig
from rollbank.tasks.model import Task

if TYPE_CHECKING:
    from rollbank.sandbox.pool import WarmPool


def spec_for(task: Task, env: BuiltEnvironment | None, *, network: bool = False) -> SandboxSpec:
    """The sandbox spec of a task's built environment (task limits, loopback unless allowed;
    the image's USER for the agent's shell)."""
    return SandboxSpec(
        layers=tuple(env.layers) if env else (),
        workdir=env.workdir if env else (task.workdir or "/"),
        env=dict(env.env) if env else dict(task.env),
        limits=Limits(cpus=task.cpus, memory_mb=task.memory_mb, storage_mb=task.storage_mb),
        network=network and task.allow_internet,
        user=env.user if env else None,
        label=task.task_id,
    )


class TaskVerifier:
    """The task's own verifier (``episodes/verifier.py``), reduced to a verdict.

    Processes the agent left running are killed before verification (``kill_leftovers``:
    a background loop must not rewrite the reward file) unless the task declares that the
    verifier needs them (``Task.services``, Harbor ``[environment] services = true``).
    """

    _ERRORS: ClassVar[dict[str, Reason]] = {
        "crash": Reason.VERIFIER_CRASH, "timeout": Reason.VERIFIER_TIMEOUT,
        "no_reward": Reason.VERIFIER_NO_REWARD, "host_stalled": Reason.HOST_STALLED}

    async def verify(self, sandbox: Sandbox, task: Task) -> VerifierVerdict:
        from rollbank.episodes.verifier import run_verifier

        # what the agent left running is killed first unless the task declares a service
        r = await run_verifier(sandbox, task, kill_leftovers=not task.services)
        error = self._ERRORS.get(r.status.value)
        detail = "" if error is None else f"{r.error or ''}\n{r.stderr_tail[-1500:]}".strip()
        return VerifierVerdict(r.reward, dict(r.rewards), passed=r.passed, error=error,
                               detail=detail, duration_s=r.duration_s)


class Layers:
    """Built environments by task, built lazily once each (per-task lock), cached by the builder."""

    def __init__(self, builder: BuilderConfig, *, network: bool = False) -> None:
        self.builder = EnvironmentBuilder(builder)
        self.network = network
        self._built: dict[str, tuple[SandboxSpec, tuple[str, ...]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def spec(self, task: Task) -> tuple[SandboxSpec, tuple[str, ...]]:
        lock = self._locks.setdefault(task.task_id, asyncio.Lock())
        async with lock:
            if task.task_id not in self._built:
                env = await asyncio.to_thread(self.builder.build, task)
                self._built[task.task_id] = (spec_for(task, env, network=self.network),
                                             env.layer_hashes)
            return self._built[task.task_id]


SpecOf = Callable[[Task], Awaitable[tuple[SandboxSpec, tuple[str, ...]]]]


class WarmSource:
    """Fork every episode's sandbox from the task's warm snapshot (made on first use)."""

    name = "warm"

    def __init__(self, pool: WarmPool, spec_of: SpecOf) -> None:
        self.pool = pool
        self.spec_of = spec_of

    async def prepare(self, tasks: Sequence[Task]) -> None:
        """Build and snapshot these tasks now (set-up, before the collection clock starts)."""
        for t in tasks:
            spec, _ = await self.spec_of(t)
            await self.pool.snapshot(t.task_id, spec)

    async def acquire(self, task: Task, *, budget_s: float | None) -> Acquired:
        spec, hashes = await self.spec_of(task)
        (sb,) = await self.pool.fork(task.task_id, spec, 1, budget_s=budget_s)
        return Acquired(sb, hashes, spec.workdir, "warm")

    async def aclose(self) -> None:
        return None


class ColdSource:
    """Build (optionally from scratch) and start a fresh sandbox per episode."""

    name = "cold"

    def __init__(self, backend: SandboxBackend, builder: BuilderConfig, *, rebuild: bool,
                 network: bool = False) -> None:
        self.backend = backend
        self.builder_config = builder
        self.rebuild = rebuild
        self.network = network
        self._shared = EnvironmentBuilder(builder)

    async def acquire(self, task: Task, *, budget_s: float | None) -> Acquired:
        cache: Path | None = None
        try:
            if self.rebuild:
                cache = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="rollbank-cold-"))
                builder = EnvironmentBuilder(self.builder_config.model_copy(
                    update={"cache_root": str(cache)}))
            else:
                builder = self._shared
            env = await asyncio.to_thread(builder.build, task)
            sb = await self.backend.start(spec_for(task, env, network=self.network),
                                          budget_s=budget_s)
        except BaseException:
            if cache is not None:
                await asyncio.to_thread(shutil.rmtree, cache, True)
            raise
        if cache is not None:
            sb = _CleanupSandbox(sb, cache)
        return Acquired(sb, env.layer_hashes, env.workdir, "cold",
                        {"build_s": env.build_s, "steps_built": env.steps_built})

    async def aclose(self) -> None:
        return None


class _CleanupSandbox:
    """A sandbox that deletes its private layer cache once closed (delegates the rest)."""

    def __init__(self, inner: Sandbox, cache: Path) -> None:
        self._inner = inner
        self._cache: Path | None = cache

    @property
    def sandbox_id(self) -> str:
        return self._inner.sandbox_id

    @property
    def alive(self) -> bool:
        return self._inner.alive

    async def exec(self, command: str | Sequence[str], *, timeout_s: float | None = None,
                   cwd: str | None = None, env: Mapping[str, str] | None = None,
                   stdin: bytes | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
                   ) -> ExecResult:
        return await self._inner.exec(command, timeout_s=timeout_s, cwd=cwd, env=env,
                                      stdin=stdin, output_limit=output_limit)

    @property
    def can_pin(self) -> bool:
        return isinstance(self._inner, PinnedExec) and self._inner.can_pin

    async def exec_pinned(self, command: str | Sequence[str], *, pins: Sequence[str],
                          timeout_s: float | None = None, cwd: str | None = None,
                          env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                          output_limit: int = DEFAULT_OUTPUT_LIMIT) -> ExecResult:
        if not isinstance(self._inner, PinnedExec):
            raise SandboxError("this sandbox cannot run pinned commands")
        return await self._inner.exec_pinned(command, pins=pins, timeout_s=timeout_s, cwd=cwd,
                                             env=env, stdin=stdin, output_limit=output_limit)

    async def kill_leftovers(self) -> None:
        if isinstance(self._inner, PinnedExec):
            await self._inner.kill_leftovers()

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await self._inner.write_file(path, data, mode=mode)

    async def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        return await self._inner.read_file(path, limit=limit)

    async def upload(self, local: Path, remote: str) -> None:
        await self._inner.upload(local, remote)

    async def download(self, remote: str, local: Path) -> None:
        await self._inner.download(remote, local)

    async def shell(self) -> ShellSession:
        return await self._inner.shell()

    async def snapshot(self) -> Snapshot:
        return await self._inner.snapshot()

    def usage(self) -> SandboxUsage:
        return self._inner.usage()

    async def close(self) -> None:
        try:
            await self._inner.close()
        finally:
            if self._cache is not None:
                cache, self._cache = self._cache, None
                await asyncio.to_thread(shutil.rmtree, cache, True)


@contextlib.asynccontextmanager
async def open_sandboxes(
    cfg: SandboxSection, tasks: Sequence[Task], *, prepare: Sequence[Task] | None = None
) -> AsyncIterator[SandboxPlane]:
    """Open the backend (local, or the Ray cluster ``cfg.ray.address`` names) and the source
    the config asks for (warm pool or cold).

    Warm: the ``prepare`` tasks (default: all) are built and snapshotted before this yields
    (on every sandbox node with Ray); any other task is built and snapshotted on its first
    episode. With Ray the plane carries the cluster's live slots (``SandboxPlane.capacity``).
    """
    from rollbank.sandbox.pool import WarmPool

    network = cfg.local.allow_network
    async with contextlib.AsyncExitStack() as stack:
        backend: SandboxBackend
        capacity: CapacityFeed | None = None
        if cfg.ray.address is not None:
            from rollbank.sandbox.ray.backend import RaySandboxBackend

            backend = capacity = await stack.enter_async_context(
                RaySandboxBackend(cfg.ray, cfg.local))
        else:
            from rollbank.sandbox.local.backend import LocalBackend

            backend = LocalBackend(cfg.local)
            stack.push_async_callback(backend.aclose)
        if not cfg.warm:
            yield SandboxPlane(ColdSource(backend, cfg.builder, rebuild=cfg.cold_rebuild,
                                          network=network), TaskVerifier(), capacity)
            return
        pool = await stack.enter_async_context(WarmPool(backend))
        source = WarmSource(pool, Layers(cfg.builder, network=network).spec)
        await source.prepare(tasks if prepare is None else prepare)
        yield SandboxPlane(source, TaskVerifier(), capacity)
