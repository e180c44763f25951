"""Billing on real sandboxes: a host stall (frozen cgroup) is never the model's time; the
model's own loop or sleep is; OOM/pids events are the last command's, not the sandbox life's.

The injected stall freezes the running command's own cgroup from the test (as rollbank's
snapshot or an operator would) for longer than the step timeout, then thaws it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path

import pytest

from rollbank.episodes.attribution import (
    Experiment,
    Probe,
    ProbeState,
    ReplayEvidence,
    ReplayState,
    death_reason,
)
from rollbank.episodes.outcome import Reason
from rollbank.errors import SandboxDiedError
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.protocol import ExecResult, Limits, SandboxSpec

pytestmark = pytest.mark.integration

FREEZE_S = 3.0  # longer than every step timeout used below


async def start(backend: LocalBackend, base: Path, **limits: int) -> LocalSandbox:
    sb = await backend.start(SandboxSpec(layers=(base,), limits=Limits(**limits)))
    assert isinstance(sb, LocalSandbox)
    return sb


def _find_group(v2: Path, marker: str) -> Path | None:
    for g in v2.glob("x*"):
        with contextlib.suppress(OSError):
            for pid in (g / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    if marker in Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "):
                        return g
    return None


async def _command_group(sb: LocalSandbox, marker: str) -> Path:
    """The per-command cgroup holding a process whose command line contains ``marker``."""
    assert sb.cgroup.v2 is not None, "this host has no cgroup v2 hierarchy to freeze"
    for _ in range(2000):
        if (g := _find_group(sb.cgroup.v2, marker)) is not None:
            return g
        await asyncio.sleep(0.005)
    raise AssertionError(f"no command group runs {marker!r}")


async def _freeze_while(sb: LocalSandbox, marker: str, run: Awaitable[ExecResult]) -> ExecResult:
    """Run a command; freeze its cgroup for FREEZE_S as soon as it runs; thaw; its result."""
    task = asyncio.ensure_future(run)
    group = await _command_group(sb, marker)
    (group / "cgroup.freeze").write_text("1")
    await asyncio.sleep(FREEZE_S)
    with contextlib.suppress(OSError):  # the group is gone if rollbank stopped the command
        (group / "cgroup.freeze").write_text("0")
    return await task


async def test_frozen_exec_is_neither_timed_out_nor_billed(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    r = await _freeze_while(sb, "sleep 1.01", sb.exec("sleep 1.01; echo done", timeout_s=2.0))
    assert r.ok and not r.timed_out and not r.host_stalled and r.stdout == "done\n"
    assert r.duration_s > 2.0  # the wall time passed the step timeout ...
    assert r.stall_s >= FREEZE_S - 0.5 and r.billed_s < 2.0  # ... the bill did not
    assert sb.usage().stall_seconds == r.stall_s
    assert sb.usage().exec_seconds == pytest.approx(r.billed_s)


async def test_frozen_shell_command_is_neither_timed_out_nor_billed(
    backend: LocalBackend, base: Path
) -> None:
    sb = await start(backend, base)
    sh = await sb.shell()
    await sh.run("X=kept", timeout_s=10)
    r = await _freeze_while(sb, "sleep 1.02", sh.run("sleep 1.02; echo $X", timeout_s=2.0))
    assert r.ok and not r.timed_out and r.stdout == "kept\n"  # the session survived too
    assert r.duration_s > 2.0 and r.stall_s >= FREEZE_S - 0.5 and r.billed_s < 2.0
    await sh.close()


async def test_model_loop_and_model_sleep_still_time_out(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    loop = await sb.exec("while true; do :; done", timeout_s=1.0)
    assert loop.timed_out and not loop.host_stalled and loop.billed_s >= 1.0
    nap = await sb.exec("sleep 1000", timeout_s=1.0)  # a model's sleep is its own time
    assert nap.timed_out and nap.billed_s >= 1.0 and nap.stall_s < 0.5
    sh = await sb.shell()
    r = await sh.run("while true; do :; done", timeout_s=1.0)
    assert r.timed_out and r.billed_s >= 1.0
    await sh.close()


async def test_a_stall_beyond_the_cap_is_host_stalled_not_a_timeout(
    tmp_path: Path, base: Path
) -> None:
    async with LocalBackend(LocalSandboxConfig(run_dir=tmp_path / "run", max_host_stall_s=1.0)) as be:
        sb = await start(be, base)
        r = await _freeze_while(sb, "sleep 50", sb.exec("sleep 50", timeout_s=30))
        assert r.host_stalled and not r.timed_out and not r.budget_exhausted and r.exit_code is None
        assert (await sb.exec("echo alive")).stdout == "alive\n"


async def test_an_earlier_oom_does_not_explain_a_later_host_death(
    backend: LocalBackend, base: Path
) -> None:
    """Regression (#8 defect 3): the OOM flag was cumulative over the sandbox's life."""
    sb = await start(backend, base, memory_mb=96)
    r = await sb.exec("python3 -c 'b = bytearray(400 << 20)'")
    assert r.oom_killed and sb.usage().memory_limit_hit  # the model's OOM, in its command
    assert (await sb.exec("true")).ok and not sb.usage().memory_limit_hit
    running = asyncio.ensure_future(sb.exec("sleep 60"))
    await _command_group(sb, "sleep 60")
    os.kill(sb.anchor_pid, signal.SIGKILL)  # the host takes the sandbox down mid-command
    with pytest.raises(SandboxDiedError):
        await running
    u = sb.usage()
    assert not u.memory_limit_hit and u.oom_kills_total >= 1
    # what the runner's experiment finds: the episode's sandbox dead, a pristine fork answers
    seen = Experiment(episode=Probe(ProbeState.DEAD), pristine=Probe(ProbeState.OK))
    # the replay of the model's commands leaves a fork healthy: the host's doing
    healthy = ReplayEvidence(ReplayState.HEALTHY, fork_probe=Probe(ProbeState.OK))
    assert death_reason(u, replace(seen, replay=healthy))[0] is Reason.SANDBOX_DIED
    # even when a replay reproduced a death, the earlier OOM does not name it
    broke = ReplayEvidence(ReplayState.REPRODUCED, 2, "sleep 60", Probe(ProbeState.DEAD))
    assert death_reason(u, replace(seen, replay=broke))[0] is Reason.SANDBOX_WRECKED
