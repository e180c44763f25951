"""A peer router process in front of rollbank's vLLM servers: ``vllm-router`` (PyPI, Rust, made
for vLLM) or ``sglang-router`` (PyPI, SGLang's gateway, ``launch`` sub-command).

Owns :class:`PeerRouter`, an async context manager that starts the router binary on free
ports, waits until it answers, and stops it. Invariant: the process runs in its own process
group and the whole group is killed on exit (normal, error or cancellation), so a benchmark
never leaves a router behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx

from rollbank.inference.server import free_port

PEER_ROUTERS = ("vllm-router", "sglang-router")


def find_router(name: str) -> str | None:
    """A router executable: beside this interpreter first, then on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def find_vllm_router() -> str | None:
    return find_router("vllm-router")


class PeerRouter:
    """``<router> --policy P --worker-urls ...`` on a free local port."""

    def __init__(
        self,
        binary: str,
        worker_urls: Sequence[str],
        policy: str,
        extra_args: Sequence[str] = (),
        *,
        startup_timeout_s: float = 60.0,
        log_path: Path | None = None,
    ) -> None:
        self.binary = binary
        self.worker_urls = list(worker_urls)
        self.policy = policy
        self.extra_args = list(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._proc: asyncio.subprocess.Process | None = None

    def command(self) -> list[str]:
        sglang = Path(self.binary).name.startswith("sglang")
        return [
            self.binary, *(["launch"] if sglang else []),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--policy", self.policy, "--worker-urls", *self.worker_urls,
            "--prometheus-port", str(free_port()), "--log-level", "warn" if sglang else "warning",
            "--disable-retries", "--worker-startup-check-interval", "1",
            *self.extra_args,
        ]  # fmt: skip

    async def __aenter__(self) -> PeerRouter:
        log = self.log_path.open("ab") if self.log_path else asyncio.subprocess.DEVNULL
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.command(), stdin=asyncio.subprocess.DEVNULL, stdout=log,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            )
        finally:
            if not isinstance(log, int):
                log.close()
        try:
            await self._wait_ready()
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stop()

    async def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                if self._proc.returncode is not None:
                    raise RuntimeError(f"vllm-router exited with {self._proc.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    resp = await http.get(f"{self.url}/v1/models")
                    if resp.status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"vllm-router not ready after {self.startup_timeout_s} s")
                await asyncio.sleep(0.2)

    async def _stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
