"""The process-wide state behind every Harbor trial: backend, builder, one snapshot per task.

Owns :class:`HarborPlane` and :func:`plane_for`. Harbor runs a job's trials concurrently in
one event loop and constructs one environment object per trial; they share one plane per
(event loop, configuration): one :class:`~rollbank.sandbox.local.backend.LocalBackend`, one
:class:`~rollbank.tasks.builder.EnvironmentBuilder` and one
:class:`~rollbank.sandbox.pool.WarmPool`, so a task is built once (layers cached on disk
across processes too) and snapshotted once, and every trial of it — attempts (``-k``),
oracle and nop runs of one job — is a sibling forked from that snapshot.

Invariants
- A task's environment is built once per plane even when trials ask at the same time
  (per-task lock); a failed build is not cached (the next trial retries and reports it).
- The snapshot key is the task's content hash plus its network mode: a changed task folder is
  a new environment, never a stale snapshot.
- Every sandbox handed out belongs to the caller (the environment's ``stop`` closes it); the
  plane's backend is closed when the process exits (:mod:`atexit`), which closes any
  sandbox a crashed trial left and removes the process's snapshot files.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from rollbank.errors import InputError
from rollbank.integrations.harbor.config import HarborProviderConfig
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.pool import WarmPool
from rollbank.sandbox.protocol import Limits, Sandbox, SandboxSpec
from rollbank.tasks import oci
from rollbank.tasks.builder import BuiltEnvironment, EnvironmentBuilder
from rollbank.tasks.config import BuilderConfig
from rollbank.tasks.loader import load_task
from rollbank.tasks.model import Task


@dataclass
class PlaneStats:
    builds: int = 0  # environments built (or found in the layer cache) by this plane
    forks: int = 0  # sandboxes forked from a task snapshot
    fork_s: list[float] = field(default_factory=list)  # wall seconds of each fork


@dataclass(frozen=True)
class Started:
    """A trial's sandbox and what it was made from."""

    sandbox: Sandbox
    task: Task
    built: BuiltEnvironment
    fork_s: float


class HarborPlane:
    """See module docstring."""

    def __init__(self, config: HarborProviderConfig) -> None:
        self.config = config
        self.backend = LocalBackend(LocalSandboxConfig(
            allow_network=True, max_storage_mb=config.max_storage_mb))
        fields: dict[str, object] = {"network": config.build_network,
                                     "cache_root": config.cache_root,
                                     "hub_mirror": config.hub_mirror}
        if config.registries is not None:
            fields["registries"] = config.registries
        self.builder_config = BuilderConfig.model_validate(fields)
        self.builder = EnvironmentBuilder(self.builder_config)
        self.pool = WarmPool(self.backend)
        self.stats = PlaneStats()
        self._tasks: dict[Path, Task] = {}
        self._built: dict[str, BuiltEnvironment] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def task(self, task_dir: Path) -> Task:
        """The rollbank task of a Harbor task folder (loaded once; raises ``InputError``)."""
        if task_dir not in self._tasks:
            self._tasks[task_dir] = await asyncio.to_thread(load_task, task_dir)
        return self._tasks[task_dir]

    async def built(self, task: Task) -> BuiltEnvironment:
        lock = self._locks.setdefault(task.content_hash, asyncio.Lock())
        async with lock:
            if task.content_hash not in self._built:
                self._built[task.content_hash] = await asyncio.to_thread(self.builder.build, task)
                self.stats.builds += 1
            return self._built[task.content_hash]

    async def start(self, environment_dir: Path, *, limits: Limits, network: bool,
                    env: dict[str, str], label: str) -> Started:
        """A sandbox for the environment at ``environment_dir`` (a task's ``environment/``, or
        the folder of a separate verifier environment), forked from its snapshot."""
        task_dir = await asyncio.to_thread(task_dir_of, environment_dir)
        task = await self.task(task_dir)
        if environment_dir != task_dir / "environment":
            task = environment_variant(task, environment_dir)
        if task.dockerfile is None and task.docker_image is not None:
            check_pullable(task, self.builder_config)
        built = await self.built(task)
        spec = SandboxSpec(layers=built.layers, workdir=built.workdir,
                           env={**built.env, **env}, limits=limits, network=network,
                           label=label)
        key = f"{task.content_hash}:{'net' if network else 'lo'}:{sorted(env.items())}:{limits}"
        snap = await self.pool.snapshot(key, spec)
        t0 = asyncio.get_running_loop().time()
        (sb,) = await self.backend.fork(snap, 1)
        fork_s = asyncio.get_running_loop().time() - t0
        self.stats.forks += 1
        self.stats.fork_s.append(fork_s)
        return Started(sb, task, built, fork_s)

    async def aclose(self) -> None:
        await self.backend.aclose()


def check_pullable(task: Task, config: BuilderConfig) -> None:
    """A prebuilt ``docker_image`` task (no Dockerfile) runs on the image as published, so a
    configured registry must serve it: else :class:`InputError` naming the task and the
    reference (no Debian approximation stands in for an image a task ships as its whole
    environment)."""
    ref = task.docker_image or ""
    if not config.pull:
        raise InputError(f"task {task.task_id}: docker_image {ref!r} needs pulling, which is "
                         "off ([builder] pull = false)", file=task.path / "task.toml")
    if oci.source_for(ref, registries=config.registries, hub_mirror=config.hub_mirror) is None:
        raise InputError(
            f"task {task.task_id}: no configured registry serves its docker_image {ref!r} "
            f"(registries {config.registries}, hub_mirror {config.hub_mirror}); pass "
            "--ek registries=HOST[:PORT] or --ek hub_mirror=HOST:PORT",
            file=task.path / "task.toml")


def task_dir_of(environment_dir: Path) -> Path:
    """The task folder an environment folder belongs to: the nearest one with a task.toml."""
    for d in (environment_dir, *environment_dir.parents):
        if (d / "task.toml").is_file():
            return d
    raise InputError("no task.toml above the environment folder", file=environment_dir)


def environment_variant(task: Task, environment_dir: Path) -> Task:
    """``task`` built from another environment folder of it (Harbor's separate verifier
    environment, ``[verifier] environment_mode = "separate"``): that folder's Dockerfile and
    build context, its own content key."""
    rel = environment_dir.relative_to(task.path).as_posix()
    key = hashlib.sha256(f"{task.content_hash}:{rel}".encode()).hexdigest()
    return dataclasses.replace(task, task_id=f"{task.task_id}@{rel}", content_hash=key,
                               dockerfile=environment_dir / "Dockerfile",
                               context_dir=environment_dir, workdir=None, skills_source=None)


_PLANES: dict[tuple[int, str], HarborPlane] = {}


def plane_for(config: HarborProviderConfig) -> HarborPlane:
    """The running event loop's plane for ``config`` (made on first use)."""
    key = (id(asyncio.get_running_loop()), config.model_dump_json())
    plane = _PLANES.get(key)
    if plane is None:
        plane = _PLANES[key] = HarborPlane(config)
    return plane


@atexit.register
def _close_planes() -> None:
    """Close every plane's backend (sandboxes a crashed trial left, snapshot files)."""
    planes = list(_PLANES.values())
    _PLANES.clear()
    for plane in planes:
        with contextlib.suppress(Exception):
            asyncio.run(plane.aclose())
