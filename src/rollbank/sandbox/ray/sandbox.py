"""A sandbox on a Ray node, as the driver sees it: the ``Sandbox`` protocol by actor calls.

Owns :class:`RaySandbox`, :class:`RayShell` and :class:`RaySnapshot`. Every method is one
awaited call to the node's :class:`~rollbank.sandbox.ray.host.NodeHost`; ``usage()`` and
``alive`` answer from the state the last call returned (every command call returns it), so
the synchronous parts of the protocol make no call.

Invariants
- ``sandbox_id`` is ``<node id, 8 hex>:<local id>``: an attempt's record says on which node
  it ran.
- A sandbox whose node was lost is not ``alive`` and raises
  :class:`~rollbank.errors.SandboxLostError` (a ``SandboxDiedError``: infra) from every call
  but ``close``, which never raises for a lost node.
- Host paths in ``upload`` / ``download`` are the *driver's*: files travel as tar bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rollbank.errors import SandboxError
from rollbank.sandbox.protocol import (
    DEFAULT_OUTPUT_LIMIT,
    ExecResult,
    SandboxSpec,
    SandboxUsage,
    ShellSession,
)
from rollbank.sandbox.ray.cluster import NodeRef


@dataclass
class RaySnapshot:
    """A snapshot on the cluster. From ``snapshot_spec``: made on any node on first use there
    (``per_node``: node id -> that node's snapshot id). From ``Sandbox.snapshot()``: a frozen
    layer on one node (``spec`` None), usable only there."""

    snapshot_id: str
    key: str
    spec: SandboxSpec | None
    per_node: dict[str, str] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    @property
    def node_bound(self) -> bool:
        return self.spec is None


class RaySandbox:
    """See module docstring."""

    def __init__(self, node: NodeRef, local_id: str,
                 on_closed: Callable[[RaySandbox], None]) -> None:
        self.node = node
        self.local_id = local_id
        self._on_closed = on_closed
        self._usage = SandboxUsage(exec_seconds=0.0)
        self._alive = True
        self._closed = False

    @property
    def sandbox_id(self) -> str:
        return f"{self.node.short}:{self.local_id}"

    @property
    def alive(self) -> bool:
        return self._alive and not self._closed and not self.node.lost

    def _note(self, reply: tuple[ExecResult, SandboxUsage, bool]) -> ExecResult:
        result, self._usage, self._alive = reply
        return result

    async def exec(self, command: str | Sequence[str], *, timeout_s: float | None = None,
                   cwd: str | None = None, env: Mapping[str, str] | None = None,
                   stdin: bytes | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
                   ) -> ExecResult:
        cmd = command if isinstance(command, str) else list(command)
        return self._note(await self.node.call(
            "exec", self.local_id, cmd, timeout_s, cwd, dict(env) if env else None, stdin,
            output_limit))

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await self.node.call("write_file", self.local_id, path, data, mode)

    async def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        data: bytes = await self.node.call("read_file", self.local_id, path, limit)
        return data

    async def upload(self, local: Path, remote: str) -> None:
        name = local.name or "upload"
        tar = await asyncio.to_thread(_tar_one, local, name)
        await self.node.call("upload", self.local_id, name, tar, remote)

    async def download(self, remote: str, local: Path) -> None:
        data: bytes = await self.node.call("download", self.local_id, remote)
        await asyncio.to_thread(_untar_one, data, local)

    async def shell(self) -> ShellSession:
        shell_id: str = await self.node.call("shell_open", self.local_id)
        return RayShell(self, shell_id)

    async def snapshot(self) -> RaySnapshot:
        snap_id: str = await self.node.call("snapshot", self.local_id)
        return RaySnapshot(f"{self.node.short}:{snap_id}", key=snap_id, spec=None,
                           per_node={self.node.node_id: snap_id})

    def usage(self) -> SandboxUsage:
        return self._usage

    async def refresh(self) -> None:
        """Read usage and liveness now (they are otherwise those of the last command)."""
        self._usage, self._alive = await self.node.call("state", self.local_id)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._on_closed(self)
        if self.node.lost:
            return  # its sandboxes died with the node
        with contextlib.suppress(SandboxError):  # lost meanwhile: nothing is left to close
            await asyncio.shield(self.node.call("close", self.local_id))


class RayShell:
    """A persistent shell of a :class:`RaySandbox`, living in its node's host."""

    def __init__(self, sandbox: RaySandbox, shell_id: str) -> None:
        self._sb = sandbox
        self._id = shell_id

    async def run(self, command: str, *, timeout_s: float | None = None) -> ExecResult:
        return self._sb._note(await self._sb.node.call("shell_run", self._id, command, timeout_s))

    async def close(self) -> None:
        if self._sb.node.lost:
            return
        with contextlib.suppress(SandboxError):
            await self._sb.node.call("shell_close", self._id)


def _tar_one(path: Path, name: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(path), arcname=name)
    return buf.getvalue()


def _untar_one(data: bytes, local: Path) -> None:
    """Extract the single top-level entry of ``data`` to ``local`` (unsafe members refused)."""
    parent = local.parent if local.parent.exists() else None
    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = {m.name.split("/", 1)[0] for m in tar.getmembers()}
            tar.extractall(tmp, filter="data")
        if len(names) != 1:
            raise SandboxError(f"download: expected one entry, got {sorted(names)}")
        if local.is_dir():
            shutil.rmtree(local)
        shutil.move(Path(tmp) / names.pop(), local)
