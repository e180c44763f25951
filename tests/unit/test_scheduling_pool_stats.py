"""The pool's incremental summaries equal summarising the whole list, to the last bit."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rollbank.batching.batch import DistStats
from rollbank.quantiles import quantile
from rollbank.scheduling.policy.pool import ExactSum, Pool, RankStat


def _full(values: list[float]) -> DistStats:
    """What the profile computed before the pool was incremental (sort, fsum, quantile)."""
    xs = sorted(values)
    if not xs:
        return DistStats(0, 0.0, 0.0, 0.0, 0.0)
    return DistStats(len(xs), math.fsum(xs) / len(xs), quantile(xs, 0.5) or 0.0,
                     quantile(xs, 0.9) or 0.0, xs[-1])


_values = st.floats(min_value=0.0, max_value=1e9, allow_nan=False) | st.integers(0, 50).map(float)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_values, max_size=40), max_size=8))
def test_incremental_summaries_equal_the_full_list_after_every_chunk(
        chunks: list[list[float]]) -> None:
    pool = Pool()
    seen: list[float] = []
    rewards: list[float] = []
    for chunk in chunks:
        for i, x in enumerate(chunk):
            reward = None if i % 3 == 2 else x / 7
            pool.add_finished(x, int(x) % 97, reward)
            seen.append(x)
            if reward is not None:
                rewards.append(reward)
        assert pool.duration_stats() == _full(seen)
        assert pool.token_stats() == _full([float(int(x) % 97) for x in seen])
        assert pool.reward_mean() == (math.fsum(rewards) / len(rewards) if rewards else 0.0)


def test_exact_sum_matches_fsum_where_naive_summation_drifts() -> None:
    rng = random.Random(7)
    s = ExactSum()
    values: list[float] = []
    for _ in range(50):
        chunk = [rng.choice([1e16, -1e16, 1.0, 1e-8, 3.3]) * rng.random() for _ in range(200)]
        values += chunk
        s.tail += chunk
        assert s.total() == math.fsum(values)
    assert sum(values) != math.fsum(values)  # the case is one where plain summation is off
    assert len(s.parts) < 10  # the values folded into a short expansion


def test_rank_stat_is_the_nearest_rank_quantile_for_every_size() -> None:
    rng = random.Random(3)
    for q in (0.0, 0.1, 0.5, 0.9, 1.0):
        r = RankStat(q)
        values: list[float] = []
        for _ in range(60):
            chunk = [float(rng.randint(0, 9)) for _ in range(rng.randint(1, 5))]
            values += chunk
            r.add(chunk)
            assert r.value() == quantile(values, q)
