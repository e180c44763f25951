"""An in-sandbox agent's one endpoint: its gateway session, and nothing else.

A sandbox's network namespace is loopback only. With the local backend's agent channels on
(``sandbox.local.agent_channels``), each sandbox has a private host directory bound read-only
at ``/run/rollbank`` (``sandbox/local``). :func:`forwarded` puts there

- ``gw.sock``: a unix socket whose host side relays every connection to the gateway's
  address (the gateway's host and port from the attempt's base URL; no other target exists);
- ``rb-forward``: a small static program (``agents/csrc/rb_forward.c``, built once into the
  cache) that listens on ``127.0.0.1:PORT`` inside the sandbox and relays to ``gw.sock``;

and yields the in-sandbox :class:`~rollbank.agents.contract.LLM` (``http://127.0.0.1:PORT/
s/<session>/v1`` with the attempt's key) and the command that starts the forwarder. What the
agent can reach is then: its gateway (with its key: its own session only — another attempt's
URL needs that attempt's key), and loopback inside its own sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

from rollbank.agents.contract import LLM
from rollbank.config import cache_dir
from rollbank.errors import ConfigError, SandboxError

CHANNEL_MOUNT = "/run/rollbank"  # sandbox/local/runtime.py CHANNEL_MOUNT
DEFAULT_PORT = 18080


@runtime_checkable
class HasChannel(Protocol):
    @property
    def channel_dir(self) -> Path | None: ...


@dataclass(frozen=True)
class Forwarded:
    llm: LLM  # the endpoint as the agent inside the sandbox sees it
    start: str  # shell command that starts the forwarder (returns once it listens)


def forwarder_binary() -> Path:
    """``rb-forward``, compiled static the first time (cached by source digest)."""
    src = resources.files("rollbank.agents").joinpath("csrc/rb_forward.c").read_bytes()
    target = cache_dir() / "bin" / f"rb-forward-{hashlib.sha256(src).hexdigest()[:16]}"
    if os.access(target, os.X_OK):
        return target
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SandboxError("rb-forward needs a C compiler (cc) and a static libc (libc6-dev)")
    target.parent.mkdir(parents=True, exist_ok=True)
    c_file = target.with_suffix(".c.tmp")
    c_file.write_bytes(src)
    out = target.with_suffix(".tmp")
    proc = subprocess.run([cc, "-static", "-O2", "-Wall", "-o", str(out), "-x", "c", str(c_file)],
                          capture_output=True, text=True, check=False)
    c_file.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise SandboxError(f"rb-forward does not compile: {proc.stderr.strip()[-1000:]}")
    out.rename(target)
    return target


async def _pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            w.write_eof()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _relay_to(host: str, port: int) -> Handler:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(host, port)
        except OSError:
            w.close()
            return
        try:
            await asyncio.gather(_pipe(r, uw), _pipe(ur, w))
        finally:
            for x in (w, uw):
                x.close()

    return handle


@contextlib.asynccontextmanager
async def forwarded(sandbox: object, llm: LLM, *, port: int = DEFAULT_PORT) -> AsyncIterator[Forwarded]:
    """Open the attempt's one forwarded endpoint in ``sandbox``'s channel (see the module)."""
    chan = sandbox.channel_dir if isinstance(sandbox, HasChannel) else None
    if chan is None:
        raise ConfigError("an in-sandbox agent needs the local backend's agent channel: set "
                          "sandbox.local.agent_channels = true", field="sandbox.local.agent_channels")
    u = urlsplit(llm.base_url)
    if u.hostname is None or u.port is None:
        raise ConfigError(f"gateway URL without host:port: {llm.base_url}", field="agent.entry")
    binary = await asyncio.to_thread(forwarder_binary)
    await asyncio.to_thread(shutil.copy2, binary, chan / "rb-forward")
    sock = chan / "gw.sock"
    server = await asyncio.start_unix_server(_relay_to(u.hostname, u.port), path=str(sock))
    sock.chmod(0o666)  # the sandbox's root is an unmapped uid here: "other" must write
    inner = LLM(f"http://127.0.0.1:{port}{u.path}", llm.api_key, llm.model)
    try:
        yield Forwarded(inner, f"{CHANNEL_MOUNT}/rb-forward {port} {CHANNEL_MOUNT}/gw.sock")
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5.0)
        sock.unlink(missing_ok=True)
