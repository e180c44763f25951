"""Where an episode's sandbox comes from, and how it is verified: the runner's two seams.

- :class:`SandboxSource`: ``acquire(task)`` returns a started sandbox plus what reproduces it
  (layer hashes, workdir). The optimized arm forks from a warm pool snapshot; the naive arm
  builds and starts a cold sandbox per episode (see :mod:`rollbank.episodes.real_sources`).
- :class:`Verifier`: runs the task's tests in the sandbox after the agent finished and
  reduces the result to a :class:`~rollbank.episodes.attribution.VerifierVerdict`.

Invariants
- ``acquire`` raises :class:`~rollbank.errors.BuildError` when the environment cannot be
  built and :class:`~rollbank.errors.SandboxError` when the runtime cannot start it; the
  runner maps those to ``env_build_failed`` / ``sandbox_start_failed``.
- The caller owns the returned sandbox and closes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from rollbank.episodes.attribution import VerifierVerdict
from rollbank.sandbox.protocol import CapacityFeed, Sandbox
from rollbank.tasks.model import Task


@dataclass
class Acquired:
    sandbox: Sandbox
    layer_hashes: tuple[str, ...] = ()
    workdir: str | None = None
    kind: str = "warm"  # "warm" (forked from a snapshot) or "cold" (built and started)
    detail: dict[str, object] = field(default_factory=dict)


class SandboxSource(Protocol):
    @property
    def name(self) -> str: ...

    async def acquire(self, task: Task, *, budget_s: float | None) -> Acquired: ...

    async def aclose(self) -> None: ...


class Verifier(Protocol):
    """Scores a finished episode's sandbox.

    A verifier reports its own failures (crash, timeout, no reward written, a host-stalled
    run) in the verdict's ``error``; it raises only :class:`~rollbank.errors.SandboxError`,
    when the sandbox under it failed.
    """

    async def verify(self, sandbox: Sandbox, task: Task) -> VerifierVerdict: ...


@dataclass
class SandboxPlane:
    """Where a collection's episodes get their sandboxes, and who verifies them."""

    source: SandboxSource
    verifier: Verifier
    capacity: CapacityFeed | None = None  # a cluster's live sandbox slots (None: the config's)
