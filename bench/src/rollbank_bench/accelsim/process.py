"""Start and stop accelsim benchmark engine processes (one per emulated accelerator).

Owns :class:`AccelSimServers`, an async context manager: ``num_servers`` processes of
``python -m rollbank_bench.accelsim``, each in its own process group with
``PR_SET_PDEATHSIG`` (as :mod:`rollbank.inference.server` does for vLLM), healthy before
``__aenter__`` returns, terminated (group SIGTERM, then SIGKILL) on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from types import TracebackType

import httpx

import rollbank
import rollbank_bench
from rollbank.errors import InferenceError
from rollbank.inference.process_groups import set_pdeathsig
from rollbank.inference.server import free_port
from rollbank.inference.vllm_client import VLLMClient

# this checkout's rollbank_bench and rollbank win in the child
SRC = os.pathsep.join(dict.fromkeys(str(Path(m.__file__ or "").resolve().parents[1])
                                    for m in (rollbank_bench, rollbank)))


class AccelSimServers:
    """``num_servers`` engine processes with ``profile``; ``.urls`` / ``.clients`` once entered."""

    def __init__(
        self,
        profile: str,
        num_servers: int = 1,
        *,
        host: str = "127.0.0.1",
        seed: int = 0,
        served_model: str = "accelsim",
        log_dir: Path | None = None,
        startup_timeout_s: float = 60.0,
        vocab_size: int | None = None,
        max_model_len: int | None = None,
        token_scale: float | None = None,
        time_scale: float | None = None,
    ) -> None:
        self.profile = profile
        self.num_servers = num_servers
        self.host = host
        self.seed = seed
        self.served_model = served_model
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s
        self.overrides: dict[str, float | int | None] = {
            "--vocab-size": vocab_size, "--max-model-len": max_model_len,
            "--token-scale": token_scale, "--time-scale": time_scale}
        self.ports: list[int] = []
        self.procs: list[asyncio.subprocess.Process] = []
        self.clients: list[VLLMClient] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.host}:{p}" for p in self.ports]

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the engine processes have used so far (Linux /proc)."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for proc in self.procs:
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
        return total

    async def __aenter__(self) -> AccelSimServers:
        try:
            for i in range(self.num_servers):
                port, proc = await self._spawn(i)
                self.ports.append(port)
                self.procs.append(proc)
            await asyncio.gather(*(self._wait_healthy(u, p) for u, p in zip(self.urls, self.procs, strict=True)))
        except BaseException:
            await self._stop_all()
            raise
        self.clients = [VLLMClient(u, scale_out=True) for u in self.urls]
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for c in self.clients:
            await c.aclose()
        await self._stop_all()

    async def _spawn(self, i: int) -> tuple[int, asyncio.subprocess.Process]:
        """Start engine ``i``'s process; its port and process (the caller places them)."""
        port = free_port(self.host)
        cmd = [sys.executable, "-m", "rollbank_bench.accelsim", "--profile", self.profile,
               "--host", self.host, "--port", str(port), "--seed", str(self.seed),
               "--served-model-name", self.served_model]
        for flag, value in self.overrides.items():
            if value is not None:
                cmd += [flag, str(value)]
        out: int | None = asyncio.subprocess.DEVNULL
        log = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = (self.log_dir / f"accelsim-{i}.log").open("ab")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH", "")) if p)
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=log or out, stderr=log or out, start_new_session=True,
            preexec_fn=set_pdeathsig, env=env,
        )
        if log is not None:
            log.close()
        return port, proc

    async def _wait_healthy(self, url: str, proc: asyncio.subprocess.Process) -> None:
        """Until ``proc`` (serving ``url``) answers ``/health``. Only its own exit counts: another
        engine killed meanwhile (the fault campaign's restarts overlap) is not this one's failure."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout_s
        async with httpx.AsyncClient(base_url=url, timeout=2.0) as http:
            while loop.time() < deadline:
                if proc.returncode is not None:
                    raise InferenceError(f"accelsim engine at {url} exited during startup", server=url)
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/health")).status_code == 200:
                        return
                await asyncio.sleep(0.1)
        raise InferenceError(f"accelsim engine at {url} not healthy after {self.startup_timeout_s} s",
                             server=url)

    async def _stop_all(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), timeout=5.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        self.procs.clear()
