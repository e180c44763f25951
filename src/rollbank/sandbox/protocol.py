"""The sandbox seam: what an episode may ask of an isolated environment.

Backends (local bubblewrap+overlayfs today; remote or Ray-hosted later) implement
:class:`SandboxBackend` and :class:`Sandbox`; :mod:`rollbank.sandbox.fake` is the in-memory
fake used by unit tests. Nothing above this seam knows how isolation is done.

Invariants every backend keeps
- A sandbox starts from read-only layers plus one private writable layer; siblings forked from
  one snapshot see the same files and never each other's writes.
- ``exec`` never raises for anything the *command* did (non-zero exit, signal, timeout,
  flood of output): that is data in :class:`ExecResult`. It raises
  :class:`~rollbank.errors.SandboxError` only when the runtime itself failed.
- ``close`` kills every process of the sandbox and is idempotent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

DEFAULT_OUTPUT_LIMIT = 64 * 1024
TRUNCATION_MARKER = "\n[... output truncated by rollbank: {dropped} bytes dropped ...]\n"


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox (from task.toml [environment], operator caps)."""

    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    max_processes: int = 512
    max_open_files: int = 1024
    max_file_size_mb: int = 1024


@dataclass(frozen=True)
class SandboxSpec:
    """Everything needed to start one sandbox.

    ``layers`` are read-only directories, lowest first (base filesystem, then the task's built
    environment layers). ``network`` False means loopback only. ``user`` is the image's
    ``USER``: the agent's shell sessions (:meth:`Sandbox.shell`) run as it, as ``docker exec``
    without ``-u`` would; ``None`` or root: root. One-shot ``exec``, pinned commands and file
    transfers run as root (rollbank's own runtime, verifier and oracle steps use them).
    """

    layers: tuple[Path, ...]
    workdir: str = "/"
    env: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    network: bool = False
    hostname: str = "sandbox"
    user: str | None = None  # the image's USER (shell sessions); None: root
    label: str = ""  # free text for logs (task id, episode id)


@dataclass(frozen=True)
class ExecResult:
    """What one command did. Output is decoded as UTF-8 with replacement characters."""

    exit_code: int | None  # None when killed by a signal or timed out
    signal: int | None  # the signal that ended it, if any
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False  # the per-step timeout fired and the command was killed
    budget_exhausted: bool = False  # the per-episode budget ran out during this command
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    oom_killed: bool = False  # the sandbox's memory limit killed a process during this command
    pids_limit_hit: bool = False  # the process limit refused a fork during this command
    stall_s: float = 0.0  # wall seconds the host measurably stalled it (not billed)
    host_stalled: bool = False  # stopped because the host stalled it too long (not the model)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.host_stalled

    @property
    def billed_s(self) -> float:
        """What the model is billed (step timeout, budget): wall time minus host stall
        (see ``rollbank.sandbox.billing``)."""
        return max(0.0, self.duration_s - self.stall_s)


@dataclass(frozen=True)
class SandboxUsage:
    """Accounting the episode layer uses to attribute failures (e.g. a fork bomb).

    ``memory_limit_hit`` / ``pids_limit_hit`` are the *last command's* events (the command
    that ran when the sandbox died, or the last one run): an OOM earlier in the episode does
    not explain a later death. The ``*_total`` counts cover the sandbox's whole life.
    """

    exec_seconds: float  # billed seconds of exec so far (what the budget charges)
    peak_memory_bytes: int | None = None
    pids_limit_hit: bool = False  # during the last command
    memory_limit_hit: bool = False  # during the last command
    stall_seconds: float = 0.0  # host stall not billed, summed over commands
    oom_kills_total: int = 0
    pids_limit_hits_total: int = 0


class ShellSession(Protocol):
    """A persistent shell inside a sandbox: cwd, environment and shell variables survive."""

    async def run(self, command: str, *, timeout_s: float | None = None) -> ExecResult: ...

    async def close(self) -> None: ...


@runtime_checkable
class Snapshot(Protocol):
    """A frozen state of a sandbox (or a built environment) from which siblings fork."""

    @property
    def snapshot_id(self) -> str: ...


class Sandbox(Protocol):
    """One running isolated environment."""

    @property
    def sandbox_id(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        """Run a command (a string goes to ``/bin/sh -c``). Charges the episode budget."""
        ...

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, *, limit: int | None = None) -> bytes: ...

    async def upload(self, local: Path, remote: str) -> None:
        """Copy a host file or directory tree into the sandbox."""
        ...

    async def download(self, remote: str, local: Path) -> None: ...

    async def shell(self) -> ShellSession: ...

    async def snapshot(self) -> Snapshot:
        """Freeze the current writable state; the sandbox keeps running on a fresh layer."""
        ...

    def usage(self) -> SandboxUsage: ...

    async def close(self) -> None: ...


@runtime_checkable
class PinnedExec(Protocol):
    """Optional sandbox capability: run a command (the verifier) with the sandbox's current
    state except ``pins``, which show the *pristine* layers' version (the toolchain the
    task was built with), and files the agent added at ``/`` hidden. The view is private to
    that command; the sandbox's other processes keep theirs. ``can_pin`` False: this sandbox
    cannot (the caller falls back to ``exec`` and says so)."""

    @property
    def can_pin(self) -> bool: ...

    async def exec_pinned(
        self,
        command: str | Sequence[str],
        *,
        pins: Sequence[str],
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult: ...

    async def kill_leftovers(self) -> None:
        """SIGKILL every process the sandbox's commands left running, with no race against
        one that keeps forking (the sandbox itself stays up)."""
        ...


class SandboxBackend(Protocol):
    """Starts sandboxes from specs or snapshots. One per process; owns cleanup of all."""

    async def start(self, spec: SandboxSpec, *, budget_s: float | None = None) -> Sandbox: ...

    async def fork(
        self, snapshot: Snapshot, n: int, *, budget_s: float | None = None
    ) -> list[Sandbox]:
        """Start ``n`` siblings from one snapshot (one GRPO group)."""
        ...

    async def snapshot_spec(self, spec: SandboxSpec) -> Snapshot:
        """A ready snapshot of a spec's initial state (the warm pool keeps one per task)."""
        ...

    async def aclose(self) -> None:
        """Close every sandbox this backend started; release snapshots."""
        ...


class CapacityFeed(Protocol):
    """The sandbox slots of a backend whose capacity changes (cluster nodes join and leave)."""

    @property
    def capacity(self) -> int:
        """Sandbox slots now."""
        ...

    def watch(self) -> AsyncIterator[int]:
        """The capacity now, then each new value as it changes (until the backend closes)."""
        ...
