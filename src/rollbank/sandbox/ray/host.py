"""The per-node host: the body of the Ray actor that runs the local backend on its CPU node.

Owns :class:`NodeHost`. One instance per node (placed there by
:mod:`rollbank.sandbox.ray.cluster`), holding one
:class:`~rollbank.sandbox.local.backend.LocalBackend` and every sandbox, shell and snapshot
it made, by id. The driver side (:mod:`rollbank.sandbox.ray.sandbox`) reaches them by
actor calls; only ids, specs, bytes and result records cross the wire.

Invariants
- The warm state of a task is made once per node: ``snapshot_spec`` is cached by the
  driver's content key of the spec (:func:`rollbank.sandbox.ray.backend.spec_key`); a
  failed one is not cached.
- Every call that runs a command returns the sandbox's usage and liveness with its result, so
  the driver answers ``Sandbox.usage()`` / ``alive`` without a call.
- ``aclose`` (or the actor's death: sandboxes die with the actor's event-loop thread, bwrap
  ``--die-with-parent``) ends every sandbox of the node; nothing outlives the actor.
- The actor runs its methods on one event loop thread (a Ray async actor), the thread the
  local backend must start sandboxes from.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from rollbank.errors import SandboxDiedError, SandboxError
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.local.snapshot import LocalSnapshot
from rollbank.sandbox.protocol import ExecResult, SandboxSpec, SandboxUsage, ShellSession

# (result, the sandbox's usage after it, whether it is still alive)
Reply = tuple[ExecResult, SandboxUsage, bool]


class NodeHost:
    """The local backend of one node, addressed by ids (see module docstring)."""

    def __init__(self, config: LocalSandboxConfig, node_id: str) -> None:
        self.node_id = node_id
        self.backend = LocalBackend(config)
        self._sandboxes: dict[str, LocalSandbox] = {}
        self._shells: dict[str, tuple[str, ShellSession]] = {}  # shell id -> (sandbox id, session)
        self._snapshots: dict[str, LocalSnapshot] = {}
        self._by_key: dict[str, asyncio.Future[str]] = {}  # spec key -> snapshot id

    # ---------------------------------------------------------------- identity
    async def info(self) -> dict[str, object]:
        """Where this host runs and which rollbank it imported (checked by the driver)."""
        import rollbank

        return {"node_id": self.node_id, "pid": os.getpid(), "rollbank": rollbank.__file__,
                "sandboxes": len(self._sandboxes)}

    # ---------------------------------------------------------------- backend
    async def snapshot_spec(self, key: str, spec: SandboxSpec) -> str:
        """This node's snapshot of ``spec`` (made once per ``key``)."""
        fut = self._by_key.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._by_key[key] = fut
            try:
                snap = await self.backend.snapshot_spec(spec)
            except BaseException as exc:
                del self._by_key[key]
                fut.set_exception(exc)
                fut.exception()  # retrieved: waiters re-raise it
                raise
            self._snapshots[snap.snapshot_id] = snap
            fut.set_result(snap.snapshot_id)
        return await asyncio.shield(fut)

    async def start(self, spec: SandboxSpec, budget_s: float | None) -> str:
        sb = await self.backend.start(spec, budget_s=budget_s)
        self._sandboxes[sb.sandbox_id] = sb
        return sb.sandbox_id

    async def fork(self, snapshot_id: str, n: int, budget_s: float | None) -> list[str]:
        snap = self._snapshot(snapshot_id)
        out = []
        for sb in await self.backend.fork(snap, n, budget_s=budget_s):
            assert isinstance(sb, LocalSandbox)
            self._sandboxes[sb.sandbox_id] = sb
            out.append(sb.sandbox_id)
        return out

    async def release_snapshot(self, snapshot_id: str) -> None:
        snap = self._snapshots.pop(snapshot_id, None)
        if snap is not None and snap.owned_dir is not None:
            await asyncio.to_thread(self.backend.release_snapshot, snap)

    async def aclose(self) -> None:
        for sb_id in list(self._sandboxes):
            await self.close(sb_id)
        await self.backend.aclose()

    # ---------------------------------------------------------------- sandbox
    async def exec(self, sb_id: str, command: str | Sequence[str], timeout_s: float | None,
                   cwd: str | None, env: Mapping[str, str] | None, stdin: bytes | None,
                   output_limit: int) -> Reply:
        sb = self._sandbox(sb_id)
        res = await sb.exec(command, timeout_s=timeout_s, cwd=cwd, env=env, stdin=stdin,
                            output_limit=output_limit)
        return res, sb.usage(), sb.alive

    async def write_file(self, sb_id: str, path: str, data: bytes, mode: int) -> None:
        await self._sandbox(sb_id).write_file(path, data, mode=mode)

    async def read_file(self, sb_id: str, path: str, limit: int | None) -> bytes:
        return await self._sandbox(sb_id).read_file(path, limit=limit)

    async def upload(self, sb_id: str, name: str, tar: bytes, remote: str) -> None:
        """``tar`` holds ``name`` (a file or a directory tree) packed on the driver."""
        sb = self._sandbox(sb_id)
        with tempfile.TemporaryDirectory(prefix="rollbank-up-") as tmp:
            await asyncio.to_thread(_untar, tar, Path(tmp))
            await sb.upload(Path(tmp) / name, remote)

    async def download(self, sb_id: str, remote: str) -> bytes:
        """A tar holding ``remote`` under its base name."""
        sb = self._sandbox(sb_id)
        name = Path(remote.rstrip("/")).name or "root"
        with tempfile.TemporaryDirectory(prefix="rollbank-down-") as tmp:
            await sb.download(remote, Path(tmp) / name)
            return await asyncio.to_thread(_tar, Path(tmp) / name, name)

    async def snapshot(self, sb_id: str) -> str:
        snap = await self._sandbox(sb_id).snapshot()
        self._snapshots[snap.snapshot_id] = snap
        return snap.snapshot_id

    async def state(self, sb_id: str) -> tuple[SandboxUsage, bool]:
        sb = self._sandbox(sb_id)
        return sb.usage(), sb.alive

    async def close(self, sb_id: str) -> None:
        for shell_id, (owner, session) in list(self._shells.items()):
            if owner == sb_id:
                del self._shells[shell_id]
                await session.close()
        sb = self._sandboxes.pop(sb_id, None)
        if sb is not None:
            await sb.close()

    # ---------------------------------------------------------------- shells
    async def shell_open(self, sb_id: str) -> str:
        session = await self._sandbox(sb_id).shell()
        shell_id = "h" + uuid.uuid4().hex[:12]
        self._shells[shell_id] = (sb_id, session)
        return shell_id

    async def shell_run(self, shell_id: str, command: str, timeout_s: float | None) -> Reply:
        found = self._shells.get(shell_id)
        if found is None:
            raise SandboxError(f"no shell {shell_id} on node {self.node_id[:8]}")
        sb = self._sandbox(found[0])
        res = await found[1].run(command, timeout_s=timeout_s)
        return res, sb.usage(), sb.alive

    async def shell_close(self, shell_id: str) -> None:
        found = self._shells.pop(shell_id, None)
        if found is not None:
            await found[1].close()

    # ---------------------------------------------------------------- lookups
    def _sandbox(self, sb_id: str) -> LocalSandbox:
        sb = self._sandboxes.get(sb_id)
        if sb is None:
            raise SandboxDiedError(f"no sandbox {sb_id} on node {self.node_id[:8]} (closed)")
        return sb

    def _snapshot(self, snapshot_id: str) -> LocalSnapshot:
        snap = self._snapshots.get(snapshot_id)
        if snap is None:
            raise SandboxError(f"no snapshot {snapshot_id} on node {self.node_id[:8]}")
        return snap


def _tar(path: Path, name: str) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(path), arcname=name)
    return buf.getvalue()


def _untar(data: bytes, into: Path) -> None:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
