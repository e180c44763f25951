"""What a command's time is billed to the model: wall time minus measured host stall.

Pure accounting (no I/O): readings of a command's cgroup counters go in, the billed seconds
and the step-deadline decisions come out. :mod:`rollbank.sandbox.local.meter` takes the
readings; the fake backend feeds injected stalls; unit tests use hand-made readings.

Design (stated for issue #8, "a host stall cannot bill the model")
- A command is billed ``wall - host_stall``, where
  ``host_stall = frozen + max(0, cpu_full_stall - cpu_throttled)``:
  - ``frozen``: seconds the command's cgroup was frozen (``cgroup.freeze`` by rollbank's
    snapshot, an operator or a test; kernel counter ``frozen_usec`` of ``cgroup.stat.local``,
    Linux >= 6.17; an ancestor's freeze counts too). The command cannot run at all.
  - ``cpu_full_stall``: PSI ``cpu.pressure`` "full" of the command's cgroup — time during
    which *every* runnable task of the command waited for a CPU, i.e. the command made no
    progress because the host's CPUs were busy with someone else.
  - ``cpu_throttled``: time the sandbox's own CPU quota throttled it (``throttled_time`` /
    ``throttled_usec``). Throttling shows up as PSI stall too but it is the model's doing
    (more busy processes than its ``cpus``), so it is taken back out of the credit.
  A model's own sleep, I/O wait, memory reclaim against its own limit, and any CPU it burns
  stay billed: ``sleep 1000`` and ``while true; do :; done`` are the model's time.
  Missing counters (older kernels, no PSI) read as 0: billing falls back to wall time.
- The step timeout and the episode budget are in billed seconds: when the wall-clock wait
  ends, the command is killed only if its billed time reached the timeout; otherwise the
  wait is extended by what is left. A host that stalls a command for more than
  ``max_host_stall_s`` (credit in total) ends it as ``host_stalled`` (infra), never as the
  model's timeout.
- Decided in this order when a wall-clock wait ends (issue #13: the fault soak at load 40-58
  found CPU-heavy model commands -- ``rm -rf /``, a memory hog, a fork loop -- stopped as
  ``host_stalled`` although they were running, only slowly):
  1. billed time reached the timeout -> ``timed_out`` (the model's), whatever else the host
     also stalled: the stall was credited, the model's own time alone used the step up;
  2. credit beyond ``max_host_stall_s`` -> measured over the last window of at least
     :data:`PROGRESS_WINDOW_S` (the command's own CPU time, ``cpu.stat usage_usec``):
     - the host is not stalling it now (stall under half the window: it sleeps or waits for
       I/O, billed time runs) -> wait, the billed deadline decides;
     - it is stalled but still gets CPU (>= :data:`MIN_PROGRESS_CPU_S` in the window):
       *slowed* by contention, not *stopped* -> wait, the credit keeps growing, up to
       :data:`SLOWED_STALL_FACTOR` times the cap (then ``host_stalled``: the host is too slow
       to let the command finish; it is still never billed);
     - stalled and no CPU at all (a frozen cgroup, every task starved) -> ``host_stalled``.
     Without a CPU-usage counter (cgroup v1) the cap alone decides, as before.
- The progress window is the time since the previous check (:class:`DeadlineWatch` keeps
  it), never since the command's start: a command frozen 3 s past a 1 s cap then thawed
  showed, over its whole life, little stall and some CPU (its start-up) and ran on to a
  timeout (the real-sandbox test did). So the first check comes when the cap could first be
  crossed (not at the timeout), every check before the crossing restarts the window, and a
  first check already beyond the cap starts a fresh window instead of judging the start-up:
  a frozen command is ``host_stalled`` about one window after its credit passes the cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

#: Never re-check a deadline more often than this (a frozen command would otherwise spin).
MIN_RECHECK_S = 0.05
#: Beyond the cap, progress is judged over a window of at least this many wall seconds.
PROGRESS_WINDOW_S = 1.0
#: CPU seconds a command must get in that window to count as running (a frozen or fully
#: starved cgroup gets exactly 0; one runnable task among 100 on one core gets ~10 ms).
MIN_PROGRESS_CPU_S = 0.002
#: A command still running beyond the cap is credited up to this many times the cap.
SLOWED_STALL_FACTOR = 6.0


@dataclass(frozen=True)
class StallReading:
    """Cumulative counters of one command's cgroup at one instant (seconds)."""

    t: float  # the clock (monotonic wall time)
    frozen_s: float = 0.0
    cpu_full_s: float = 0.0
    throttled_s: float = 0.0
    oom_kills: int = 0  # memory-limit kills, cumulative for the sandbox
    pids_hits: int = 0  # process-limit refusals, cumulative for the sandbox
    cpu_used_s: float | None = None  # CPU time the command's group got (None: not measured)


@dataclass(frozen=True)
class Bill:
    """A command's time split into what the model is billed and what the host stalled."""

    wall_s: float
    stall_s: float
    frozen_s: float
    cpu_stall_s: float
    oom_kills: int  # during this command
    pids_hits: int  # during this command

    @property
    def billed_s(self) -> float:
        return max(0.0, self.wall_s - self.stall_s)


def bill(start: StallReading, end: StallReading) -> Bill:
    """The bill of the interval between two readings (counters are deltas, clamped)."""
    wall = max(0.0, end.t - start.t)
    frozen = min(wall, max(0.0, end.frozen_s - start.frozen_s))
    cpu = max(0.0, (end.cpu_full_s - start.cpu_full_s) - (end.throttled_s - start.throttled_s))
    cpu = min(wall - frozen, cpu)  # PSI and the freezer do not overlap; never exceed the wall
    return Bill(
        wall_s=wall, stall_s=frozen + cpu, frozen_s=frozen, cpu_stall_s=cpu,
        oom_kills=max(0, end.oom_kills - start.oom_kills),
        pids_hits=max(0, end.pids_hits - start.pids_hits),
    )


class Verdict(Enum):
    WAIT = "wait"  # keep waiting ``wait_s`` more wall seconds
    TIMED_OUT = "timed_out"  # the billed time reached the timeout: the model's timeout
    HOST_STALLED = "host_stalled"  # the host stalled it beyond the cap: not the model's


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    wait_s: float = 0.0
    #: the caller keeps its progress-window start (the window was too short to judge)
    keep_window: bool = False


@dataclass(frozen=True)
class BilledDeadline:
    """A step deadline in billed seconds (``timeout_s`` None: no deadline, no checks)."""

    start: StallReading
    timeout_s: float | None
    max_host_stall_s: float

    def first_wait(self) -> float | None:
        """Wall seconds to wait before the first check (None: wait for the command only):
        the timeout, or the moment a stall from the start could pass the cap if sooner."""
        if self.timeout_s is None:
            return None
        return min(self.timeout_s, self.max_host_stall_s + MIN_RECHECK_S)

    def check(self, now: StallReading, since: StallReading | None = None) -> Decision:
        """Called when a wall-clock wait ended with the command still running. ``since``:
        the reading that starts the progress window (the previous check's, unless it asked
        to keep its window; None: no check yet). :class:`DeadlineWatch` keeps it."""
        if self.timeout_s is None:
            return Decision(Verdict.WAIT, 3600.0)  # not reached: no deadline, no checks
        b = bill(self.start, now)
        left = self.timeout_s - b.billed_s
        if left <= 0:  # the model's own time used the step up; the stall was credited
            return Decision(Verdict.TIMED_OUT)
        if b.stall_s > self.max_host_stall_s:
            return self._beyond_cap(b, now, since, left)
        # re-check no later than the cap could be crossed by a stall that continues
        cap_left = self.max_host_stall_s - b.stall_s
        return Decision(Verdict.WAIT, max(MIN_RECHECK_S, min(left, cap_left + MIN_RECHECK_S)))

    def _beyond_cap(
        self, b: Bill, now: StallReading, since: StallReading | None, left: float
    ) -> Decision:
        """The credit passed the cap: stopped by the host, or only slowed (module doc)."""
        wait = max(MIN_RECHECK_S, min(left, PROGRESS_WINDOW_S))
        if now.cpu_used_s is None:
            return Decision(Verdict.HOST_STALLED)  # no progress counter: the cap decides
        if b.stall_s > self.max_host_stall_s * SLOWED_STALL_FACTOR:
            return Decision(Verdict.HOST_STALLED)  # the host is too slow to let it finish
        if since is None:  # no check before: judge a fresh window, not the command's start-up
            return Decision(Verdict.WAIT, wait)
        if since.cpu_used_s is None:
            return Decision(Verdict.HOST_STALLED)
        window = now.t - since.t
        if window < PROGRESS_WINDOW_S - 1e-6:  # (a wait of exactly one window is one)
            return Decision(Verdict.WAIT, max(MIN_RECHECK_S, PROGRESS_WINDOW_S - window),
                            keep_window=True)
        w = bill(since, now)
        if w.stall_s < w.wall_s / 2:  # not stalled now: its own time runs, billed
            return Decision(Verdict.WAIT, wait)
        if now.cpu_used_s - since.cpu_used_s >= MIN_PROGRESS_CPU_S:  # slowed, not stopped
            return Decision(Verdict.WAIT, wait)
        return Decision(Verdict.HOST_STALLED)


@dataclass
class DeadlineWatch:
    """The checks of one wait (pure; the driver only sleeps and reads the meter): the
    deadline plus the start of the current progress window."""

    deadline: BilledDeadline
    since: StallReading | None = None  # the progress window's start (None: no check yet)

    def first_wait(self) -> float | None:
        return self.deadline.first_wait()

    def check(self, now: StallReading) -> Decision:
        decision = self.deadline.check(now, self.since)
        if not decision.keep_window:
            self.since = now
        return decision
