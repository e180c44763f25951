"""One evaluation's result row from its trajectories and request timings (pure).

Every attempt counts: a task's ``n`` is the number of attempts that ran for it, whatever
their outcome; an infra failure is a failed attempt in ``pass_at`` (what a served request
would have been) and is left out of ``pass_at_valid`` (the model's own rate, over attempts
whose outcome is a model success or failure). Costs: ``engine_s`` sums every generation's
client-side request time (concurrent requests each count their own time); ``sandbox_s``
sums every episode's sandbox holding time (the ``episode`` span: acquisition to close,
verification included); both divided by the number of successes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rollbank.episodes.outcome import Outcome
from rollbank.episodes.spans import spans_of
from rollbank.episodes.trajectory import Trajectory
from rollbank.evaluation.passk import histogram_quantile, mean_pass_at_k
from rollbank.evaluation.timing import RequestTiming
from rollbank.quantiles import quantile

PERCENTILES = (0.5, 0.95, 0.99)


def _pcts(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{round(q * 100)}": quantile(values, q) for q in PERCENTILES}


def per_task_counts(trajs: Sequence[Trajectory]) -> dict[str, dict[str, Any]]:
    """``task -> {n, successes, valid, solve_rate}`` over every attempt (``solve_rate`` =
    successes / n)."""
    out: dict[str, dict[str, int]] = {}
    for t in trajs:
        d = out.setdefault(t.task_id, {"n": 0, "successes": 0, "valid": 0})
        d["n"] += 1
        if t.outcome is not None and t.outcome.outcome.trainable:
            d["valid"] += 1
        if t.outcome is not None and t.outcome.outcome is Outcome.MODEL_SUCCESS:
            d["successes"] += 1
    return {task: {**d, "solve_rate": d["successes"] / d["n"]} for task, d in sorted(out.items())}


def ttft_summary(timings: Sequence[RequestTiming],
                 engine_histogram: Sequence[tuple[float, float]] | None) -> dict[str, Any]:
    """Time-to-first-token percentiles over the requests, and where they come from: the
    server's per-request TTFT; else each request's client round trip minus the server's decode
    interval; else the client round trip itself (non-streamed: an upper bound on TTFT). The
    engine histogram, when scraped, is reported beside them (its quantiles are bucket edges)."""
    reported = [t.first_token_s for t in timings if t.first_token_s is not None]
    minus = [max(t.total_s - t.decode_s, 0.0) for t in timings if t.decode_s is not None]
    if reported:
        out: dict[str, Any] = {"source": "server_per_request", "n": len(reported), **_pcts(reported)}
    elif minus:
        out = {"source": "client_minus_engine_decode", "n": len(minus), **_pcts(minus)}
    elif timings:
        out = {"source": "client_round_trip", "estimate": "upper bound (time to the whole answer)",
               "n": len(timings), **_pcts([t.total_s for t in timings])}
    else:
        out = {"source": None, "n": 0, **{f"p{round(q * 100)}": None for q in PERCENTILES}}
    if engine_histogram and engine_histogram[-1][1] > 0:
        out["engine_histogram"] = {
            "estimate": "upper edge of the bucket", "n": int(engine_histogram[-1][1]),
            **{f"p{round(q * 100)}": histogram_quantile(engine_histogram, q) for q in PERCENTILES}}
    return out


def score(trajs: Sequence[Trajectory], timings: Sequence[RequestTiming], *, ks: Sequence[int],
          engine_histogram: Sequence[tuple[float, float]] | None = None) -> dict[str, Any]:
    """The metrics of one evaluation (one model or checkpoint)."""
    tasks = per_task_counts(trajs)
    all_counts = [(d["n"], d["successes"]) for d in tasks.values()]
    valid_counts = [(d["valid"], d["successes"]) for d in tasks.values()]
    successes = sum(c for _, c in all_counts)
    outcomes = Counter(t.outcome.outcome.value if t.outcome else "none" for t in trajs)
    reasons = Counter(t.outcome.reason.value if t.outcome else "none" for t in trajs)
    engine_s = sum(t.total_s for t in timings)
    sandbox_s = sum(s.duration for t in trajs for s in spans_of(t, "episode"))
    tps = [v for t in timings if (v := t.tokens_per_s) is not None]
    return {
        "tasks": len(tasks),
        "attempts": len(trajs),
        "successes": successes,
        "pass_at": {str(k): mean_pass_at_k(all_counts, k) for k in ks},
        "pass_at_valid": {str(k): mean_pass_at_k(valid_counts, k) for k in ks},
        "outcomes": dict(sorted(outcomes.items())),
        "reasons": dict(sorted(reasons.items())),
        "requests": len(timings),
        "ttft_s": ttft_summary(timings, engine_histogram),
        "tokens_per_s": {"source": "client_per_request", "n": len(tps), **_pcts(tps)},
        "engine_s": engine_s,
        "sandbox_s": sandbox_s,
        "engine_s_per_success": engine_s / successes if successes else None,
        "sandbox_s_per_success": sandbox_s / successes if successes else None,
        "per_task": tasks,
    }
