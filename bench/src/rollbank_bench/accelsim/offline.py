"""Run :class:`EngineCore` over a request trace in pure virtual time (no sleeps, no HTTP).

Owns :func:`simulate`: what the accelsim benchmark engine would answer for a trace, used to fit
a profile's scale to measured runs (``rollbank bench accelsim-fidelity --calibrate``) without
the wall-clock cost of replaying every candidate.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollbank_bench.accelsim.core import EngineCore, SimRequest
from rollbank_bench.accelsim.profile import LatencyProfile


def simulate(profile: LatencyProfile, arrivals: Sequence[tuple[float, SimRequest]]) -> list[SimRequest]:
    """Each ``(arrival_s, request)`` run to completion; the requests, finished, in input order."""
    core = EngineCore(profile)
    pending = sorted(arrivals, key=lambda a: a[0])
    now, i = 0.0, 0
    while i < len(pending) or not core.idle:
        while i < len(pending) and pending[i][0] <= now:
            core.add(pending[i][1], pending[i][0])
            i += 1
        step = core.plan(now)
        if step is None:
            if i >= len(pending):
                break
            now = pending[i][0]
            continue
        now += step.duration
        core.apply(step, now)
    return [r for _, r in arrivals]
