"""Selection-bias profile: the accepted batch against the launched pool.

Over-provisioning accepts the groups that finish first, which favours short episodes; this
module makes that visible by summarising duration, model tokens and reward of the accepted
trajectories beside every valid attempt that has finished so far, plus the attempts that
never finished — still running, or aborted by the straggler policy — whose elapsed time is a
lower bound on their duration (censored). Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from rollbank.batching.batch import DistStats, GroupResult, SelectionProfile
from rollbank.quantiles import quantiles
from rollbank.scheduling.policy.ledger import Entry
from rollbank.scheduling.policy.pool import Pool


def dist(values: Iterable[float]) -> DistStats:
    """n, mean, p50, p90 (nearest rank) and max; zeros for an empty set."""
    return _dist_sorted(sorted(values))


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _dist_sorted(xs: list[float]) -> DistStats:
    """:func:`dist` of an already sorted list."""
    if not xs:
        return DistStats(0, 0.0, 0.0, 0.0, 0.0)
    p50, p90 = quantiles(xs, (0.5, 0.9))
    return DistStats(len(xs), math.fsum(xs) / len(xs), p50 or 0.0, p90 or 0.0, xs[-1])


def selection_profile(
    accepted: Sequence[GroupResult],
    accepted_entries: Sequence[Entry],
    pool: Pool,
    running: Iterable[Entry],
    now: float,
) -> SelectionProfile:
    """Profile ``accepted`` groups (and their ledger entries) against the launched ``pool``.

    Durations come from the ledger (launch to return on the scheduler's clock) for both sides.
    The pool holds valid finished attempts only; attempts that never finished (``running``
    now, or aborted earlier) are censored at their elapsed time.
    """
    running_elapsed = [now - e.launched_at for e in running]
    aborted = pool.aborted_held()
    elapsed = sorted(running_elapsed + aborted)
    return SelectionProfile(
        accepted_duration=dist(e.duration_s for e in accepted_entries if e.duration_s is not None),
        pool_duration=pool.duration_stats(),
        accepted_tokens=dist(
            float(e.model_tokens) for e in accepted_entries if e.model_tokens is not None
        ),
        pool_tokens=pool.token_stats(),
        accepted_reward_mean=_mean([r for g in accepted for r in g.rewards]),
        pool_reward_mean=pool.reward_mean(),
        censored=len(elapsed),
        censored_elapsed=_dist_sorted(elapsed),
        censored_aborted=len(aborted),
    )
