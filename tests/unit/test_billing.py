"""Billing: what a command's time costs the model (pure accounting, fake readings/clock)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rollbank.clock import FakeClock
from rollbank.episodes.billing import step_bill
from rollbank.episodes.harnesses import Command
from rollbank.episodes.tools import ToolExecutor
from rollbank.sandbox.billing import (
    MIN_RECHECK_S,
    PROGRESS_WINDOW_S,
    SLOWED_STALL_FACTOR,
    BilledDeadline,
    DeadlineWatch,
    StallReading,
    Verdict,
    bill,
)
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


# --- issue #13: beyond the cap, a command the host only slowed is not "host_stalled" ------

def cpu(t: float, stall: float, used: float) -> StallReading:
    """A reading of a command that has been starved ``stall`` s of its CPU and got ``used``."""
    return at(t, cpu_full_s=2.0 + stall, cpu_used_s=used)


C0 = cpu(100.0, 0.0, 0.0)


def test_billed_time_at_the_timeout_is_the_models_even_past_the_stall_cap() -> None:
    # 20 s wall: 12 s starved (beyond the 10 s cap) and 8 s its own: the model used its 5 s
    d = BilledDeadline(C0, timeout_s=5.0, max_host_stall_s=10.0)
    assert d.check(cpu(120.0, 12.0, 8.0)).verdict is Verdict.TIMED_OUT
    # the old order (cap first) called this host_stalled; without a usage counter too
    assert BilledDeadline(R0, 5.0, 10.0).check(at(120.0, cpu_full_s=14.0)).verdict \
        is Verdict.TIMED_OUT


def test_a_slowed_command_beyond_the_cap_keeps_running_and_is_never_billed_the_stall() -> None:
    # the soak's rm -rf / at load ~50: 4% of a CPU, starved 96% of the time
    d = BilledDeadline(C0, timeout_s=5.0, max_host_stall_s=10.0)
    prev = cpu(110.0, 9.6, 0.4)
    w = d.check(cpu(111.0, 10.56, 0.44), prev)  # 1 s window: 0.96 s starved, 40 ms of CPU
    assert w.verdict is Verdict.WAIT and not w.keep_window and w.wait_s >= MIN_RECHECK_S
    assert bill(C0, cpu(111.0, 10.56, 0.44)).billed_s == pytest.approx(0.44)


def test_a_command_without_cpu_beyond_the_cap_is_the_hosts() -> None:
    d = BilledDeadline(C0, timeout_s=5.0, max_host_stall_s=10.0)
    # frozen (cgroup.freeze): stall grows with the wall, no CPU at all
    frz = StallReading(t=111.0, frozen_s=5.0 + 10.8, cpu_full_s=2.0, throttled_s=1.0,
                       oom_kills=1, cpu_used_s=0.2)
    before = StallReading(t=110.0, frozen_s=5.0 + 9.8, cpu_full_s=2.0, throttled_s=1.0,
                          oom_kills=1, cpu_used_s=0.2)
    assert d.check(frz, before).verdict is Verdict.HOST_STALLED
    # starved outright (every task waiting, no CPU granted)
    assert d.check(cpu(111.0, 10.9, 0.1), cpu(110.0, 9.9, 0.1)).verdict is Verdict.HOST_STALLED


def test_progress_is_judged_over_a_full_window_and_the_slowdown_is_bounded() -> None:
    d = BilledDeadline(C0, timeout_s=5.0, max_host_stall_s=10.0)
    # just past the cap, 0.1 s since the last check: too short to judge, keep the window
    w = d.check(cpu(110.1, 10.05, 0.05), cpu(110.0, 9.95, 0.05))
    assert w.verdict is Verdict.WAIT and w.keep_window and w.wait_s == pytest.approx(0.9)
    # no previous check: a fresh window starts now (the start-up it ran is not judged)
    assert d.check(cpu(111.0, 10.5, 0.5)).verdict is Verdict.WAIT
    # still running, but the credit passed 6x the cap: the host is too slow to let it finish
    assert d.check(cpu(165.0, 61.0, 4.0), cpu(164.0, 60.0, 3.96)).verdict is Verdict.HOST_STALLED


def test_beyond_the_cap_a_command_the_host_no_longer_stalls_runs_to_its_billed_deadline() -> None:
    # starved for 11 s earlier, now asleep (no stall, no CPU): its own time, billed
    d = BilledDeadline(C0, timeout_s=5.0, max_host_stall_s=10.0)
    w = d.check(cpu(114.0, 11.0, 0.5), cpu(113.0, 11.0, 0.5))
    assert w.verdict is Verdict.WAIT
    assert d.check(cpu(116.0, 11.0, 0.5), cpu(115.0, 11.0, 0.5)).verdict is Verdict.TIMED_OUT


# --- the whole sequence of checks of one wait (DeadlineWatch), on a fake timeline --------

def run_watch(deadline: BilledDeadline, reading: Callable[[float], StallReading]) -> tuple[Verdict, float]:
    """What ``wait_billed`` does with a command that never ends: the verdict and its time."""
    clock = FakeClock(deadline.start.t)
    watch = DeadlineWatch(deadline)
    wait = watch.first_wait()
    assert wait is not None
    for _ in range(10_000):
        clock.advance(wait)
        d = watch.check(reading(clock.now()))
        if d.verdict is not Verdict.WAIT:
            return d.verdict, clock.now() - deadline.start.t
        wait = d.wait_s
    raise AssertionError("no verdict")


def frozen_then_asleep(t: float) -> StallReading:
    """tests/integration/test_sandbox_billing.py's `sleep 50`: 10 ms of CPU to start up,
    frozen from 0.02 s for 3 s, then thawed and asleep (no CPU, no stall)."""
    return StallReading(t=t, frozen_s=min(3.0, max(0.0, t - 0.02)), cpu_used_s=min(t, 0.02) / 2)


def test_regression_a_command_frozen_past_the_cap_is_host_stalled_while_still_frozen() -> None:
    # Branch attr checked first at the 30 s timeout and judged progress since the start: 3 s
    # of stall in 30 s and 10 ms of CPU looked "not stalled now", and it ended timed_out.
    d = BilledDeadline(StallReading(t=0.0, cpu_used_s=0.0), timeout_s=30.0, max_host_stall_s=1.0)
    verdict, at_s = run_watch(d, frozen_then_asleep)
    assert verdict is Verdict.HOST_STALLED
    # decided on frozen time alone: within one window of the cap crossing, before the thaw
    assert at_s <= 0.02 + 1.0 + MIN_RECHECK_S + PROGRESS_WINDOW_S < 3.02


def test_a_slowed_sequence_runs_on_past_the_cap_and_is_bounded() -> None:
    # 4 % of a CPU from the start (the soak's rm -rf / at load ~50), cap 3 s, timeout 30 s
    def slowed(t: float) -> StallReading:
        return StallReading(t=t, cpu_full_s=0.96 * t, cpu_used_s=0.04 * t)

    d = BilledDeadline(StallReading(t=0.0, cpu_used_s=0.0), timeout_s=30.0, max_host_stall_s=3.0)
    verdict, at_s = run_watch(d, slowed)
    assert verdict is Verdict.HOST_STALLED and 0.96 * at_s > 3.0 * SLOWED_STALL_FACTOR
    # its own time alone runs out first when the step is short: the model's timeout
    short = BilledDeadline(StallReading(t=0.0, cpu_used_s=0.0), timeout_s=0.5, max_host_stall_s=3.0)
    assert run_watch(short, slowed)[0] is Verdict.TIMED_OUT


def test_a_command_frozen_after_running_a_while_is_host_stalled_one_window_past_the_cap() -> None:
    # ran 5 s (5 s of CPU), then frozen for good: judged on the frozen window, not its life
    def late_freeze(t: float) -> StallReading:
        return StallReading(t=t, frozen_s=max(0.0, t - 5.0), cpu_used_s=min(t, 5.0))

    d = BilledDeadline(StallReading(t=0.0, cpu_used_s=0.0), timeout_s=30.0, max_host_stall_s=1.0)
    verdict, at_s = run_watch(d, late_freeze)
    assert verdict is Verdict.HOST_STALLED and at_s <= 5.0 + 1.0 + 2 * MIN_RECHECK_S + PROGRESS_WINDOW_S
