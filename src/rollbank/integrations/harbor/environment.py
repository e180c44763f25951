"""``RollbankEnvironment``: Harbor's ``BaseEnvironment`` on rollbank's local sandboxes.

Owns the Harbor-facing class; the work is done by :mod:`.plane` (build once, snapshot once,
fork per trial) and :mod:`.commands` (exec/result translation). Harbor 0.25's contract:

- ``start(force_build)``: build the task's ``environment/Dockerfile`` with rollbank's
  builder (layers cached by content hash; ``force_build`` is ignored: layers are keyed by what
  built them, so a cached layer is the same build), then fork this trial's sandbox from the
  task's snapshot (made by the first trial of the task in this process);
- ``exec(command, cwd, env, timeout_sec, user)``: ``bash -c`` in the sandbox with Harbor's
  merged env (task ``[environment] env`` < per-call < scoped), cwd (default: the task's
  ``[environment] workdir``, else the Dockerfile's ``WORKDIR``), the user switched with
  ``setpriv`` (no user given and no Harbor default user: the image's ``USER``, as
  ``docker exec`` without ``-u``); a timeout raises like Harbor's Docker environment;
- ``upload_file/upload_dir/download_file/download_dir``: tar transfers through the sandbox
  (downloads merged into existing host directories, as ``docker cp`` does);
- ``stop(delete)``: close the sandbox (every process killed, its writable layer dropped);
  snapshots and layers stay for the process's other trials.

The verifier phase: Harbor's verifier uploads the tests to ``/tests`` after the agent finished
and runs ``test.sh`` through ``exec``. From that upload on (the phase boundary Harbor's API
shows), commands run with rollbank's offline verifier shims first on PATH and, when the
sandbox can pin (rb-helper), on the task's pristine toolchain (``TOOLCHAIN_PINS``).

A prebuilt ``docker_image`` task without a Dockerfile runs on that image pulled from a
configured registry (``--ek registries=...``, ``--ek hub_mirror=...``); one no registry serves
is refused at start, naming the task and the reference.

Not supported (rejected at construction by Harbor's capability checks, or here): docker
compose environments, GPUs/TPUs,
Windows, network allowlists, host mounts (``auto_mounting``), stream/SSH mode.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.models.trial.paths import EnvironmentPaths

from rollbank.episodes.verifier import TOOLCHAIN_PINS, VERIFIER_ENV
from rollbank.errors import SandboxError
from rollbank.integrations.harbor.commands import (
    command_argv,
    harbor_result,
    merge_tree,
    network_enabled,
)
from rollbank.integrations.harbor.config import HarborProviderConfig
from rollbank.integrations.harbor.plane import HarborPlane, Started, plane_for
from rollbank.sandbox.protocol import ExecResult as SandboxResult
from rollbank.sandbox.protocol import Limits, PinnedExec, Sandbox
from rollbank.tasks.shims import SHIM_DIR, shim_files

#: Harbor's in-environment tests directory (``EnvironmentPaths.tests_dir``).
TESTS_DIR = "/tests"
OUTPUT_LIMIT = 16 << 20  # Harbor keeps a command's whole output
LOG_DIRS = EnvironmentPaths()


class RollbankEnvironment(BaseEnvironment):
    """See module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        known = set(HarborProviderConfig.model_fields)
        ours = {k: kwargs.pop(k) for k in list(kwargs) if k in known}
        self._config = HarborProviderConfig.model_validate(ours)
        self._started: Started | None = None
        self._verifying = False
        self._network = False
        self._warned_unpinned = False
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------ identity, capabilities
    @staticmethod
    def type() -> str:
        return "rollbank"

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(
            cpu_limit=True, memory_limit=True, fractional_cpus=True)

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        # a prebuilt docker_image task needs no Dockerfile: it is pulled (plane.check_pullable)
        if self.task_env_config.docker_image:
            return
        if not (self.environment_dir / "Dockerfile").is_file():
            if (self.environment_dir / "docker-compose.yaml").is_file():
                raise ValueError("rollbank environment: docker compose environments are not "
                                 "supported (one sandbox per trial)")
            raise FileNotFoundError(f"{self.environment_dir / 'Dockerfile'} not found "
                                    "(rollbank builds task environments from Dockerfiles)")

    # ------------------------------------------------------------ lifecycle
    @property
    def _plane(self) -> HarborPlane:
        return plane_for(self._config)

    @property
    def _sandbox(self) -> Sandbox:
        if self._started is None:
            raise RuntimeError("rollbank environment: not started")
        return self._started.sandbox

    async def start(self, force_build: bool) -> None:
        cfg = self.task_env_config
        limits = Limits(cpus=float(self._effective_cpus or cfg.cpus or 1),
                        memory_mb=int(self._effective_memory_mb or cfg.memory_mb or 2048),
                        storage_mb=int(cfg.storage_mb or 10240))
        network = network_enabled(self.network_policy.network_mode.value)
        self._network = network = network and self._config.public_network
        self._started = await self._plane.start(
            self.environment_dir, limits=limits, network=network,
            env=self._startup_env(), label=self.session_id)
        self.logger.debug("rollbank: %s forked in %.1f ms (%s)", self.session_id,
                          self._started.fork_s * 1e3, self._sandbox.sandbox_id)
        # what Harbor's mounted providers get from their bind mounts: the log directories
        # (agent, verifier, artifacts) exist and any user may write them; the task's workdir
        dirs = [str(d) for d in (LOG_DIRS.agent_dir, LOG_DIRS.verifier_dir,
                                 LOG_DIRS.artifacts_dir)]
        made = await self.exec(self._ensure_dirs_command(dirs), cwd="/", user="root")
        if made.return_code != 0:
            raise RuntimeError(f"rollbank: cannot create {dirs}: {made.stderr}")
        if cfg.workdir:
            await self.exec(f"mkdir -p {shlex.quote(cfg.workdir)}", cwd="/", user="root")
        if self.environment_dir.name != "environment":
            # a separate verifier environment (its own Dockerfile, e.g. tests/): it is the
            # verifier phase from the start (bundled tests are never uploaded)
            await self._enter_verifier_phase()

    async def stop(self, delete: bool) -> None:
        started, self._started = self._started, None
        if started is not None:
            await started.sandbox.close()

    # ------------------------------------------------------------ commands
    def _default_cwd(self) -> str | None:
        return self.task_env_config.workdir or None

    async def exec(self, command: str, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_sec: int | None = None,
                   user: str | int | None = None) -> ExecResult:
        argv = command_argv(command, self._user(user))
        merged = self._merge_env(env) or {}
        res = await self._run(argv, cwd=cwd or self._default_cwd(), env=merged,
                              timeout_s=float(timeout_sec) if timeout_sec else None)
        out = harbor_result(res, timeout_sec=timeout_sec)
        return ExecResult(stdout=out.stdout, stderr=out.stderr, return_code=out.return_code)

    def _user(self, user: str | int | None) -> str | int | None:
        """Docker's rule: the call's user, else Harbor's default user (the task's agent or
        verifier user), else the image's ``USER`` (``docker exec`` without ``-u``)."""
        resolved: str | int | None = self._resolve_user(user)
        if resolved is None and self._started is not None:
            return self._started.built.user
        return resolved

    async def _run(self, argv: list[str], *, cwd: str | None, env: dict[str, str],
                   timeout_s: float | None) -> SandboxResult:
        sb = self._sandbox
        if not self._verifying:
            return await sb.exec(argv, cwd=cwd, env=env, timeout_s=timeout_s,
                                 output_limit=OUTPUT_LIMIT)
        if self._config.verifier_shims:
            argv = ["/bin/sh", "-c", f'PATH={SHIM_DIR}:"$PATH" exec "$@"', "sh", *argv]
            env = {**VERIFIER_ENV, **env}
        if isinstance(sb, PinnedExec) and self._pins(sb):
            return await sb.exec_pinned(argv, pins=TOOLCHAIN_PINS, cwd=cwd, env=env,
                                        timeout_s=timeout_s, output_limit=OUTPUT_LIMIT)
        return await sb.exec(argv, cwd=cwd, env=env, timeout_s=timeout_s,
                             output_limit=OUTPUT_LIMIT)

    def _pins(self, sb: PinnedExec) -> bool:
        """Whether the verifier phase runs pinned. Not on the host's network: rb-helper
        cannot build the pinned view of a sandbox that shares the host's network namespace
        (``setns`` EPERM, a limit of the local backend), so public-network trials verify
        unpinned (logged once per trial)."""
        if not (self._config.pin_verifier and sb.can_pin):
            return False
        if self._network:
            if not self._warned_unpinned:
                self._warned_unpinned = True
                self.logger.warning("rollbank: %s verifies unpinned (public network; pass "
                                    "--ek public_network=false for pinned verification)",
                                    self.session_id)
            return False
        return True

    async def _enter_verifier_phase(self) -> None:
        """The tests are going in: the agent has finished (Harbor's verifier order)."""
        if self._verifying:
            return
        self._verifying = True
        if self._config.verifier_shims:
            for name, (data, mode) in shim_files().items():
                await self._sandbox.write_file(f"{SHIM_DIR}/{name}", data, mode=mode)

    # ------------------------------------------------------------ files
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._sandbox.upload(Path(source_path), target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        if PurePosixPath(target_dir) == PurePosixPath(TESTS_DIR):
            await self._enter_verifier_phase()
        await self._sandbox.upload(Path(source_dir), target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
        try:
            await self._sandbox.download(source_path, target)
        except FileNotFoundError:
            raise
        except SandboxError as exc:
            raise RuntimeError(f"rollbank: download {source_path} failed: {exc}") from exc

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        tmp = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="rollbank-harbor-"))
        try:
            got = tmp / "d"
            try:
                await self._sandbox.download(source_dir, got)
            except SandboxError as exc:
                raise RuntimeError(f"rollbank: download {source_dir} failed: {exc}") from exc
            await asyncio.to_thread(merge_tree, got, target)
        finally:
            await asyncio.to_thread(shutil.rmtree, tmp, True)
