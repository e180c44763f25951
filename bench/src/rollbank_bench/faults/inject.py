"""Sandbox faults from outside: SIGKILL, cgroup freeze, SIGSTOP, a full writable layer.

:class:`FaultingSource` wraps the collection's sandbox source (the runner's seam) and watches
each sandbox it hands out. When the scripted policy's fault turn writes the attempt seed to
:data:`.script.MARKER` (read through ``/proc/<anchor>/root``, as the host can), the injector
waits the schedule's delay and hits that sandbox the way the host would: SIGKILL of its
anchor (a runtime crash, the host's OOM killer), a frozen cgroup, SIGSTOP of every process
in its cgroup, or its size-limited tmpfs layer filled to ENOSPC. A slot's retries (and the
experiment's replays) run the same script: each seed is injected once, on its first sighting.
Every injection is appended to the campaign's :class:`FaultLog`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbank.episodes.sources import Acquired, SandboxSource
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.tasks.model import Task
from rollbank_bench.faults.kinds import SANDBOX_KINDS, FaultKind, FaultSchedule
from rollbank_bench.faults.script import MARKER

POLL_S = 0.1
FILL_NAME = ".rollbank-fill"


@dataclass
class Injection:
    kind: FaultKind
    seed: int | None = None  # attempt seed (sandbox and engine faults)
    attempt_id: str | None = None  # when the injector knows it (engine faults)
    detail: dict[str, Any] = field(default_factory=dict)
    t: float = field(default_factory=time.monotonic)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "seed": self.seed, "attempt_id": self.attempt_id,
                **self.detail}


class FaultLog:
    """Every fault injected, in order."""

    def __init__(self) -> None:
        self.items: list[Injection] = []
        self.done_seeds: set[int] = set()

    def first(self, seed: int) -> bool:
        """True once per seed (a slot's retries and replays are not injected again)."""
        if seed in self.done_seeds:
            return False
        self.done_seeds.add(seed)
        return True

    def add(self, inj: Injection) -> None:
        self.items.append(inj)


class FaultingSource:
    """A :class:`SandboxSource` that injects the schedule's sandbox faults (see module doc)."""

    def __init__(self, inner: SandboxSource, schedule: FaultSchedule, log: FaultLog) -> None:
        self.inner, self.schedule, self.log = inner, schedule, log
        self._watchers: set[asyncio.Task[None]] = set()
        self.errors: list[str] = []
        self.missed: list[str] = []  # kinds whose sandbox ended before the fault landed

    @property
    def name(self) -> str:
        return self.inner.name

    async def acquire(self, task: Task, *, budget_s: float | None) -> Acquired:
        acq = await self.inner.acquire(task, budget_s=budget_s)
        if isinstance(acq.sandbox, LocalSandbox):
            w = asyncio.create_task(self._watch(acq.sandbox))
            self._watchers.add(w)
            w.add_done_callback(self._watchers.discard)
        return acq

    async def aclose(self) -> None:
        for w in list(self._watchers):
            w.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    async def _watch(self, sb: LocalSandbox) -> None:
        marker = Path(f"/proc/{sb.anchor_pid}/root{MARKER}")
        while sb.alive:
            seed = read_seed(marker)
            if seed is not None:
                planned = self.schedule.planned(seed)
                if planned is None or planned.kind not in SANDBOX_KINDS or not self.log.first(seed):
                    return
                await asyncio.sleep(planned.delay_s)
                await self.land(sb, planned.kind, seed)
                return
            await asyncio.sleep(POLL_S)

    async def land(self, sb: LocalSandbox, kind: FaultKind, seed: int) -> None:
        """Inject ``kind`` into ``sb`` and log it. A sandbox that ended before the fault
        landed (its attempt finished during the fault's delay) got no fault: counted in
        ``missed``, not logged; any other injector failure is reported in ``errors``."""
        try:
            detail = await inject(sb, kind)
        except Exception as exc:
            if not sb.alive:
                self.missed.append(kind.value)
                return
            self.errors.append(f"{kind.value}: {type(exc).__name__}: {exc}")
            return
        detail["sandbox"] = sb.sandbox_id  # joins the fault to its attempt
        self.log.add(Injection(kind, seed, None, detail))


def read_seed(marker: Path) -> int | None:
    """The attempt seed a fault turn wrote (None: not there yet)."""
    try:
        return int(marker.read_text().strip())
    except (OSError, ValueError):
        return None


async def inject(sb: LocalSandbox, kind: FaultKind) -> dict[str, Any]:
    """Hit ``sb`` from outside with ``kind``; returns what was done."""
    if kind is FaultKind.SANDBOX_SIGKILL:
        os.kill(sb.anchor_pid, signal.SIGKILL)
        return {"signal": "SIGKILL", "pid": sb.anchor_pid}
    if kind is FaultKind.SANDBOX_FREEZE:
        await sb.cgroup.afreeze(True)
        return {"cgroup": "frozen"}
    if kind is FaultKind.SANDBOX_SIGSTOP:
        pids = sb.cgroup.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return {"signal": "SIGSTOP", "processes": len(pids)}
    if kind is FaultKind.DISK_FULL:
        written = await asyncio.to_thread(fill, Path(f"/proc/{sb.anchor_pid}/root/{FILL_NAME}"))
        return {"filled_bytes": written}
    raise ValueError(f"not a sandbox fault: {kind.value}")


def fill(path: Path, chunk: int = 1 << 20) -> int:
    """Write zeros to ``path`` until the filesystem is full (ENOSPC); bytes written."""
    buf = b"\0" * chunk
    n = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while True:
            try:
                n += os.write(fd, buf)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(buf) == 1:
                    return n
                buf = buf[: len(buf) // 16 or 1]  # top up the last pages
    finally:
        os.close(fd)
