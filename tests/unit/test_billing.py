"""Billing: what a command's time costs the model (pure accounting, fake readings/clock)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbank.clock import FakeClock
from rollbank.episodes.billing import step_bill
from rollbank.episodes.harnesses import Command
from rollbank.episodes.tools import ToolExecutor
from rollbank.sandbox.billing import MIN_RECHECK_S, BilledDeadline, StallReading, Verdict, bill
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.protocol import ExecResult, SandboxSpec

R0 = StallReading(t=100.0, frozen_s=5.0, cpu_full_s=2.0, throttled_s=1.0, oom_kills=1, pids_hits=0)


def at(t: float, **kw: float) -> StallReading:
    base = {"frozen_s": 5.0, "cpu_full_s": 2.0, "throttled_s": 1.0, "oom_kills": 1, "pids_hits": 0}
    base.update(kw)
    return StallReading(t=t, **base)  # type: ignore[arg-type]


def test_frozen_and_cpu_starved_time_is_not_billed_own_throttling_is() -> None:
    b = bill(R0, at(110.0, frozen_s=9.0, cpu_full_s=3.5, throttled_s=1.5))
    assert (b.wall_s, b.frozen_s, b.cpu_stall_s) == (10.0, 4.0, 1.0)  # 1.5 stall - 0.5 throttled
    assert b.billed_s == 5.0
    # a model that throttles itself (more busy processes than its cpus) gets no credit
    own = bill(R0, at(110.0, cpu_full_s=6.0, throttled_s=6.0))
    assert own.stall_s == 0.0 and own.billed_s == 10.0


def test_a_bill_never_exceeds_the_wall_and_counts_events_of_this_command_only() -> None:
    b = bill(R0, at(101.0, frozen_s=50.0, cpu_full_s=50.0, oom_kills=3, pids_hits=2))
    assert b.stall_s == 1.0 and b.billed_s == 0.0
    assert (b.oom_kills, b.pids_hits) == (2, 2)  # deltas, not the sandbox's totals
    assert bill(R0, R0).oom_kills == 0


def test_deadline_fires_on_billed_time_only() -> None:
    d = BilledDeadline(R0, timeout_s=2.0, max_host_stall_s=60.0)
    assert d.first_wait() == 2.0
    # a model's own loop or sleep: 2 s of wall, no stall -> its timeout
    assert d.check(at(102.0)).verdict is Verdict.TIMED_OUT
    # frozen 1.5 of the 2 s: only 0.5 billed -> keep waiting what is left
    w = d.check(at(102.0, frozen_s=6.5))
    assert w.verdict is Verdict.WAIT and w.wait_s == pytest.approx(1.5)
    # frozen the whole time -> never the model's timeout, re-checked at a bounded rate
    w = d.check(at(130.0, frozen_s=35.0))
    assert w.verdict is Verdict.WAIT and w.wait_s >= MIN_RECHECK_S
    assert d.check(at(131.5, frozen_s=35.0)).wait_s == pytest.approx(0.5)  # 1.5 s billed
    assert d.check(at(132.0, frozen_s=35.0)).verdict is Verdict.TIMED_OUT  # then 2 s


def test_a_stall_beyond_the_cap_is_the_hosts() -> None:
    d = BilledDeadline(R0, timeout_s=30.0, max_host_stall_s=10.0)
    w = d.check(at(109.0, frozen_s=13.0))  # 8 s stalled: wait at most until the cap
    assert w.verdict is Verdict.WAIT and w.wait_s <= 2.0 + MIN_RECHECK_S
    assert d.check(at(112.0, frozen_s=16.0)).verdict is Verdict.HOST_STALLED
    assert BilledDeadline(R0, None, 1.0).first_wait() is None  # no timeout: no checks


def test_step_bill_sums_and_flags_a_host_stop() -> None:
    rs = [ExecResult(0, None, "", "", 4.0, stall_s=3.0),
          ExecResult(None, None, "", "", 9.0, stall_s=9.0, host_stalled=True)]
    b = step_bill(rs)
    assert (b.wall_s, b.billed_s, b.stall_s, b.host_stalled) == (13.0, 1.0, 12.0, True)
    assert b.evidence()["host_stalled"] is True
    assert step_bill([ExecResult(0, None, "", "", 1.0)]).evidence() == {}
    assert not ExecResult(0, None, "", "", 1.0, host_stalled=True).ok


@pytest.mark.parametrize("use_shell", [False, True])
async def test_executor_step_timeout_and_budget_ignore_an_injected_stall(use_shell: bool) -> None:
    clock = FakeClock()
    sb = await FakeBackend(clock).start(SandboxSpec(layers=(Path("/nonexistent"),)))
    ex = ToolExecutor(sb, step_timeout_s=2.0, use_shell=use_shell, budget_s=10.0)
    sb.stall_next_s = 50.0  # the host freezes the next command far beyond timeout and budget
    r = await ex.run_one(Command("sleep 1; echo done"))
    assert r.ok and not r.timed_out and not r.budget_exhausted and r.stdout == "done\n"
    assert (r.duration_s, r.stall_s, r.billed_s) == (51.0, 50.0, 1.0)
    assert ex.used_s == 1.0 and sb.usage().exec_seconds == 1.0
    loop = await ex.run_one(Command("sleep 1000"))  # the model's own sleep is billed
    assert loop.timed_out and ex.used_s == 3.0
