"""The lower bound T_LB on time-to-trainable-batch at fixed weights.

From ../shared/reference/long-tail-and-lower-bound.md. Per trajectory i: ``d_i`` decode tokens,
``p_ij`` uncached prefill tokens at turn j, ``t_ik`` tool latencies, ``s_i`` sandbox set-up,
``v_i`` verification. Capacity: ``r*`` single-sequence decode rate, ``X_d*`` aggregate decode
rate, ``X_p*`` prefill rate, ``S`` sandbox slots.

- critical path  L_i = s_i + sum_j TTFT_min(p_ij) + d_i / r* + sum_k t_ik + v_i;
  with over-provisioning (G' >= G groups launched, the first G complete accepted) the path
  term is the G-th smallest *group* critical path (max over siblings) among the launched pool;
- inference work  max(sum d / X_d*, sum p / X_p*) over the accepted trajectories;
- sandbox work    sum o_i / S, o_i = L_i (a sandbox is held for at least the critical path).

For a batch after the first, measured from the previous hand-off (``window_start``), a
trajectory launched before that moment already had ``window_start - launched_at`` seconds of
progress: its path and its sandbox work count only what can remain, ``max(0, L_i - head
start)`` (a group carried over from the previous window can complete early in this one; without
the correction the bound exceeded the measured time, efficiency > 1).
Two floors keep the bound a bound when the capacity is slower than the run (a calibration
measured on a busier host, or reused from a cache): a trajectory's ``L_i`` is at most the time
it actually took (alone it cannot be slower than it was under contention), and the aggregate
rates are at least what the run itself achieved in the window (``observed_*_rate``), with only
the tokens produced and the verification done in the window counted as work. Without them a fast run on a slow
calibration reported efficiency above 1.
T_LB is the maximum of the three; efficiency is T_LB / T_measured (<= 1 when the bound holds).
When the capacity declares ``verifier_slots`` (verifiers are CPU-bound test suites and
rollbank runs at most that many at once), a fourth term ``verifier_work = sum v_i / slots``
joins the maximum; it is reported separately so the reference's three terms stay visible.
Measured tool, set-up and verify latencies are used as they were observed (they include host
contention, so the bound is of *this* environment on *this* machine). TTFT_min(p) is
``ttft_floor_s + p / prefill_rate_single``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rollbank.episodes.spans import spans_of
from rollbank.episodes.trajectory import Trajectory


@dataclass(frozen=True)
class Capacity:
    """Measured (or declared) capacity of the collector's resources."""

    decode_rate_single: float  # r*: tokens/s of one sequence alone on one server
    decode_rate_max: float  # X_d*: best aggregate tokens/s over all servers
    prefill_rate_single: float  # tokens/s of one prompt alone on one server
    prefill_rate_max: float  # X_p*: aggregate prefill tokens/s over all servers
    sandbox_slots: int  # S
    ttft_floor_s: float = 0.0  # fixed per-request overhead (HTTP, scheduling), measured
    source: str = "declared"  # "measured" when calibrated against the real servers
    verifier_slots: int | None = None  # verifiers at once (CPU-bound); None: no such term

    def __post_init__(self) -> None:
        for name in ("decode_rate_single", "decode_rate_max", "prefill_rate_single",
                     "prefill_rate_max"):
            if getattr(self, name) <= 0:
                raise ValueError(f"capacity {name} must be > 0")
        if self.sandbox_slots < 1:
            raise ValueError("capacity sandbox_slots must be >= 1")

    def ttft_min(self, uncached_tokens: int) -> float:
        return self.ttft_floor_s + uncached_tokens / self.prefill_rate_single

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LowerBound:
    critical_path_s: float
    inference_work_s: float
    sandbox_work_s: float
    groups_in_pool: int
    groups_needed: int
    verifier_work_s: float = 0.0

    @property
    def t_lb(self) -> float:
        return max(self.critical_path_s, self.inference_work_s, self.sandbox_work_s,
                   self.verifier_work_s)

    @property
    def binding_term(self) -> str:
        terms = {
            "critical_path": self.critical_path_s,
            "inference_work": self.inference_work_s,
            "sandbox_work": self.sandbox_work_s,
            "verifier_work": self.verifier_work_s,
        }
        return max(terms, key=lambda k: terms[k])

    def efficiency(self, measured_s: float) -> float | None:
        return self.t_lb / measured_s if measured_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "t_lb_s": self.t_lb, "binding_term": self.binding_term}


def decode_tokens(traj: Trajectory) -> int:
    return traj.num_model_tokens


def uncached_prefill(traj: Trajectory) -> list[int]:
    """Uncached prompt tokens per turn (the server's reported cache hit subtracted)."""
    return [s.uncached_tokens for s in spans_of(traj, "inference")]


def tool_latencies(traj: Trajectory) -> list[float]:
    return [s.duration for s in spans_of(traj, "exec")]


def critical_path(traj: Trajectory, cap: Capacity) -> float:
    """L_i: the time this trajectory would take alone on an idle system (at most the time it
    took, when its launch and finish are recorded)."""
    prefill = sum(cap.ttft_min(p) for p in uncached_prefill(traj))
    decode = decode_tokens(traj) / cap.decode_rate_single
    path = traj.sandbox_setup_s + prefill + decode + sum(tool_latencies(traj)) + traj.verify_s
    took = traj.finished_at - traj.launched_at
    return min(path, took) if took > 0 else path


def window_work(traj: Trajectory, window_start: float | None) -> tuple[int, int]:
    """(decode, uncached prefill) tokens of ``traj`` produced from ``window_start`` on (all of
    them without a window start or without inference spans)."""
    spans = spans_of(traj, "inference")
    if window_start is None or not spans:
        return decode_tokens(traj), sum(uncached_prefill(traj))
    mine = [s for s in spans if s.end > window_start]
    return sum(s.gen_tokens for s in mine), sum(s.uncached_tokens for s in mine)


def remaining_path(traj: Trajectory, cap: Capacity, window_start: float | None = None) -> float:
    """The part of L_i still ahead at ``window_start`` at the least: L_i minus the time since
    the trajectory was launched (L_i itself without a window start, or when launched in it)."""
    path = critical_path(traj, cap)
    if window_start is None:
        return path
    return max(0.0, path - max(0.0, window_start - traj.launched_at))


def window_verify(traj: Trajectory, window_start: float | None) -> float:
    """Seconds of ``traj``'s verification from ``window_start`` on (a group carried from the
    previous window may have been verified before it); ``verify_s`` without spans."""
    spans = spans_of(traj, "verify")
    if window_start is None or not spans:
        return traj.verify_s
    return sum(max(0.0, s.end - max(s.start, window_start)) for s in spans)


def group_paths(trajs: Iterable[Trajectory], cap: Capacity,
                window_start: float | None = None) -> dict[str, float]:
    """Group critical path: a group completes when its slowest sibling does (each sibling's
    :func:`remaining_path` from ``window_start``)."""
    out: dict[str, float] = defaultdict(float)
    for t in trajs:
        out[t.group_id] = max(out[t.group_id], remaining_path(t, cap, window_start))
    return dict(out)


def lower_bound(
    accepted: Sequence[Trajectory],
    cap: Capacity,
    *,
    pool: Sequence[Trajectory] | None = None,
    groups_needed: int | None = None,
    window_start: float | None = None,
    observed_decode_rate: float = 0.0,
    observed_prefill_rate: float = 0.0,
) -> LowerBound:
    """T_LB for producing ``accepted`` (G complete groups), given the launched ``pool``.

    ``pool`` holds every *complete* group launched in the window (accepted or not); the path
    term is its G-th smallest group path. Without a pool the accepted groups are the pool.
    ``window_start`` (the previous hand-off): paths and sandbox work count only what remains
    of trajectories launched before it (module doc). ``observed_*_rate``: aggregate rates the
    run achieved in the window, floors for the capacity's ``decode_rate_max`` and
    ``prefill_rate_max``.
    """
    need = groups_needed if groups_needed is not None else len({t.group_id for t in accepted})
    paths = sorted(group_paths(pool if pool is not None else accepted, cap, window_start).values())
    path_term = 0.0 if not paths or need == 0 else paths[min(need, len(paths)) - 1]
    work = [window_work(t, window_start) for t in accepted]
    d, p = sum(w[0] for w in work), sum(w[1] for w in work)
    inference = max(d / max(cap.decode_rate_max, observed_decode_rate),
                    p / max(cap.prefill_rate_max, observed_prefill_rate))
    sandbox = sum(remaining_path(t, cap, window_start) for t in accepted) / cap.sandbox_slots
    verifier = (sum(window_verify(t, window_start) for t in accepted) / cap.verifier_slots
                if cap.verifier_slots else 0.0)
    return LowerBound(path_term, inference, sandbox, len(paths), need, verifier)
