"""A peer router process in front of rollbank's vLLM servers: ``vllm-router`` (PyPI, Rust, made
for vLLM) or ``sglang-router`` (PyPI, SGLang's gateway, ``launch`` sub-command).

Owns :class:`PeerRouter`, an async context manager that starts the router binary on free
ports, waits until it answers, and stops it. Invariant: the process runs in its own process
group and the whole group is killed on exit (normal, error or cancellation), so a benchmark
never leaves a router behind. Also the HTTP clients every arm uses: :func:`bench_client`
(rollbank's arms, straight to a server) and :func:`peer_client` (through a peer, with the
``X-Session-ID`` its session policies hash), both on ``/v1/completions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from rollbank.inference.protocol import InferenceClient
from rollbank.inference.server import free_port
from rollbank.inference.vllm_client import VLLMClient

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


# ---------------------------------------------------------------------- HTTP clients of the arms
# vLLM's HTTP server closes idle keep-alive connections after 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE)
# and httpx keeps them for 5 s too: a request sent on a connection the server is closing fails
# with "Server disconnected". Conversations idle between turns, so expire ours well before.
KEEPALIVE_EXPIRY_S = 2.0


def http_transport() -> httpx.AsyncHTTPTransport:
    return httpx.AsyncHTTPTransport(limits=httpx.Limits(
        max_connections=256, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_EXPIRY_S))


def bench_client(url: str, model: str | None = None) -> VLLMClient:
    """A :class:`VLLMClient` whose pooled connections expire before the server drops them.

    It speaks ``/v1/completions`` exactly as :func:`peer_client` does behind a peer router
    (same route, same body, per-request engine metrics), so every arm pays the same server
    path and only the placement differs."""
    return VLLMClient(url, model=model, transport=http_transport(), scale_out=False,
                      versions_from_engine=False)


@contextlib.asynccontextmanager
async def bench_clients(urls: Sequence[str]) -> AsyncIterator[dict[str, InferenceClient]]:
    """One new :func:`bench_client` per server (fresh connections), all closed on exit."""
    clients: dict[str, InferenceClient] = {u: bench_client(u) for u in urls}
    try:
        yield clients
    finally:
        for c in clients.values():
            await c.aclose()


class SessionHeaderTransport(httpx.AsyncBaseTransport):
    """Adds ``X-Session-ID`` (what vllm-router's session policies hash) to each request.

    The session is derived from our ``X-Request-Id`` (``<arm>-<trajectory>-t<turn>``) by
    ``key``: the trajectory id, or the GRPO group id so siblings share a session.
    """

    def __init__(self, key: Callable[[str], str]) -> None:
        self._inner = http_transport()
        self._key = key

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        rid = request.headers.get("x-request-id")
        if rid:
            request.headers["X-Session-ID"] = self._key(rid)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def session_key(by: str) -> Callable[[str], str]:
    """``by`` = "trajectory" (g3s1) or "group" (g3), from a request id ``<arm>-g3s1-t2``."""

    def key(rid: str) -> str:
        traj = rid.rsplit("-", 2)[-2]
        return traj.split("s", 1)[0] if by == "group" else traj

    return key


def peer_client(url: str, model: str, by: str) -> VLLMClient:
    # Behind vllm-router: no /openapi.json or /weight_info to read, and versions do not matter
    # to a routing benchmark, so completions with the client's own version.
    return VLLMClient(url, model=model, transport=SessionHeaderTransport(session_key(by)),
                      scale_out=False, versions_from_engine=False)
