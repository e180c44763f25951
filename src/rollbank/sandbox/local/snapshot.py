"""Snapshots of local sandboxes: frozen writable layers on disk.

Owns :class:`LocalSnapshot` and the copy that freezes a writable layer. A snapshot is a list
of read-only directories, lowest first: the spec's layers plus one frozen copy of each
writable layer taken along the way. Forking gives each sibling an overlay of those layers and
its own empty writable layer, so siblings share the set-up and never each other's writes.

How ``Sandbox.snapshot()`` freezes (documented choice): the sandbox's cgroup is frozen
(``cgroup.freeze``), its tmpfs writable layer is copied with ``cp -a`` (whiteouts and
``trusted.overlay.*`` xattrs preserved) to ``run_dir/<owner>/snapshots/<id>``, and the
sandbox is thawed and keeps running on the *same* writable layer. The pause is proportional
to the size of the changes since the start, not of the environment.

Invariants: a snapshot directory is complete before the snapshot is returned and is never
written again; it is deleted only by the backend that made it (or the reaper, when that
backend's process is dead).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path

from rollbank.errors import SandboxError
from rollbank.sandbox.protocol import SandboxSpec


@dataclass(frozen=True)
class LocalSnapshot:
    """A frozen state: the spec to start from, whose ``layers`` include the frozen copies."""

    snapshot_id: str
    spec: SandboxSpec
    owned_dir: Path | None = None  # the frozen copy this snapshot added, if any

    @property
    def layers(self) -> tuple[Path, ...]:
        return self.spec.layers

    def child(self, snapshot_id: str, frozen: Path) -> LocalSnapshot:
        return LocalSnapshot(
            snapshot_id, replace(self.spec, layers=(*self.spec.layers, frozen)), frozen
        )


async def copy_tree(src: Path, dst: Path) -> None:
    """Copy a writable layer (``src/.``) to ``dst`` keeping whiteouts, xattrs, owners, modes."""
    await asyncio.to_thread(dst.mkdir, parents=True)
    proc = await asyncio.create_subprocess_exec(
        "/bin/cp", "-a", "--", f"{src}/.", f"{dst}/",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise SandboxError(f"snapshot copy {src} -> {dst} failed: {err.decode(errors='replace')}")
