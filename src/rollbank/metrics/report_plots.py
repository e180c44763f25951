"""The report's plots: timelines per server and per sandbox (outcomes, phases, batch hand-offs
and straggler tails marked, with legends), attempts at a glance, durations, ready-bank fill.

matplotlib comes from the ``report`` extra; it is imported (headless, Agg) at the first plot,
and every figure is closed after rendering (:func:`_png`).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

from rollbank.episodes.spans import Span, spans_of
from rollbank.episodes.trajectory import Trajectory
from rollbank.extras import require
from rollbank.metrics.progress import _WASTE_WHY


class _Pyplot:
    """``matplotlib.pyplot``, imported (headless, Agg) on first use."""

    _module: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._module is None:
            feature = "the HTML report's plots"
            require("matplotlib", "report", feature).use("Agg")
            self._module = require("matplotlib.pyplot", "report", feature)
        return getattr(self._module, name)


plt: Any = _Pyplot()

LEGEND_SIZE = 9  # legends and in-bar numbers: readable at the page's scale

_PHASE_COLOURS = {"sandbox_setup": "#8c564b", "exec": "#2ca02c", "verify": "#9467bd",
                  "inference": "#1f77b4"}


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _lanes(intervals: Sequence[tuple[float, float, Any]]) -> list[int]:
    """Greedy interval packing: lane index per interval, in input order (intervals that
    overlap never share a lane; a lane is reused once its last interval ended)."""
    ends: list[float] = []
    out = [0] * len(intervals)
    for k in sorted(range(len(intervals)), key=lambda k: (intervals[k][0], intervals[k][1])):
        a, b, _ = intervals[k]
        for i, e in enumerate(ends):
            if e <= a:
                ends[i] = b
                out[k] = i
                break
        else:
            ends.append(b)
            out[k] = len(ends) - 1
    return out


def server_rows(spans: Sequence[Span]) -> tuple[list[str], list[tuple[Span, float, float]]]:
    """Each server gets a band of sub-lanes (one per request in flight at once); returns the
    server names and, per span, its y position and bar height (bands are 1 tall)."""
    servers = sorted({s.server or "?" for s in spans})
    placed: list[tuple[Span, float, float]] = []
    for y, name in enumerate(servers):
        mine = [s for s in spans if (s.server or "?") == name]
        lanes = _lanes([(s.start, s.end, s) for s in mine])
        n = max(lanes, default=0) + 1
        h = 0.9 / n
        for s, lane in zip(mine, lanes, strict=True):
            placed.append((s, y - 0.45 + (lane + 0.5) * h, h * 0.9))
    return servers, placed


_OUTCOME_COLOURS = {"model_success": "#2ca02c", "model_failure": "#ff7f0e",
                    "infra_failure": "#d62728", "unknown": "#7f7f7f", "running": "#c7c7c7"}


def _outcome(t: Trajectory) -> str:
    return t.outcome.outcome.value if t.outcome is not None else "running"


def batch_marks(batches: Sequence[dict[str, Any]], t0: float) -> list[tuple[float, float, float]]:
    """Per batch (hand-off, tail start, tail end) in seconds since ``t0``: the hand-off is the
    window's end; the straggler tail runs from T90 to T100 of its accepted trajectories."""
    out = []
    for b in batches:
        start = float(b.get("t_start", t0))
        out.append((float(b.get("t_end", start)) - t0, start + float(b.get("t90_s", 0.0)) - t0,
                    start + float(b.get("t100_s", 0.0)) - t0))
    return out


def _mark_batches(ax: Any, marks: Sequence[tuple[float, float, float]]) -> list[Any]:
    """Hand-offs as dashed lines, straggler tails shaded; the legend handles for both."""
    for i, (hand, a, b) in enumerate(marks):
        if b > a:
            ax.axvspan(a, b, color="#fdd49e", alpha=0.5, zorder=0)
        ax.axvline(hand, color="black", ls="--", lw=1)
        ax.annotate(f"batch {i} handed over", (hand, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(-3, -11), textcoords="offset points", fontsize=LEGEND_SIZE, ha="right",
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
    if not marks:
        return []
    return [plt.Line2D([0], [0], color="black", ls="--", lw=1, label="batch hand-off"),
            plt.Rectangle((0, 0), 1, 1, color="#fdd49e", alpha=0.5,
                          label="straggler tail (T90 to T100 of the batch)")]


def server_timeline(trajs: Sequence[Trajectory], t0: float,
                    batches: Sequence[dict[str, Any]] = ()) -> str:
    spans = [s for t in trajs for s in spans_of(t, "inference")]
    servers, placed = server_rows(spans)
    fig, ax = plt.subplots(figsize=(11, 1.4 + 0.9 * max(len(servers), 1)))
    outcome = {t.trajectory_id: _outcome(t) for t in trajs}
    for s, y, h in placed:
        ax.barh(y, s.duration, left=s.start - t0, height=h,
                color=_OUTCOME_COLOURS.get(outcome.get(s.trajectory_id, "running"), "#c7c7c7"),
                edgecolor="none")
    ax.set_yticks(range(len(servers)), servers)
    ax.set_xlabel("seconds since first launch")
    ax.set_title("inference requests per server (a sub-lane per concurrent request; colour = "
                 "outcome of the request's attempt)")
    seen = [k for k in _OUTCOME_COLOURS if k in set(outcome.values())]
    handles = [plt.Rectangle((0, 0), 1, 1, color=_OUTCOME_COLOURS[k], label=k) for k in seen]
    handles += _mark_batches(ax, batch_marks(batches, t0))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4,
              fontsize=LEGEND_SIZE, frameon=False)
    return _png(fig)


def sandbox_timeline(trajs: Sequence[Trajectory], t0: float,
                     batches: Sequence[dict[str, Any]] = ()) -> str:
    eps = sorted(((t.launched_at, t.finished_at, t) for t in trajs), key=lambda x: x[0])
    lanes = _lanes(eps)
    fig, ax = plt.subplots(figsize=(11, 1 + 0.12 * max(max(lanes, default=0) + 1, 8)))
    for (a, b, t), lane in zip(eps, lanes, strict=True):
        ax.barh(lane, b - a, left=a - t0, height=0.9, color="#dddddd", edgecolor="none")
        for s in spans_of(t):
            if s.kind in _PHASE_COLOURS:
                ax.barh(lane, s.duration, left=s.start - t0, height=0.9,
                        color=_PHASE_COLOURS[s.kind], edgecolor="none")
    names = {"sandbox_setup": "sandbox set-up", "exec": "tool commands", "verify": "verifier",
             "inference": "waiting for the model"}
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, label=names[k])
               for k, c in _PHASE_COLOURS.items()]
    handles.append(plt.Rectangle((0, 0), 1, 1, color="#dddddd",
                                 label="held between phases (harness, queues)"))
    handles += _mark_batches(ax, batch_marks(batches, t0))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4,
              fontsize=LEGEND_SIZE, frameon=False)
    ax.set_xlabel("seconds since first launch")
    ax.set_ylabel("sandbox lane")
    ax.yaxis.set_major_locator(plt.MaxNLocator(integer=True))  # lanes are whole numbers
    ax.set_title("attempts per sandbox lane: what each held sandbox was doing")
    return _png(fig)


def attempts_at_a_glance(trajs: Sequence[Trajectory], batches: Sequence[dict[str, Any]],
                         ledger: dict[str, Any] | None) -> str:
    """Two stacked bars: the outcome of every finished attempt, and what became of every
    launched attempt (in a batch, re-run in its slot, wasted, still open)."""
    fig, ax = plt.subplots(figsize=(11, 2.2))
    counts: dict[str, int] = {}
    for t in trajs:
        counts[_outcome(t)] = counts.get(_outcome(t), 0) + 1
    left = 0
    for k, c in _OUTCOME_COLOURS.items():
        if counts.get(k):
            ax.barh(1, counts[k], left=left, color=c, label=k)
            ax.text(left + counts[k] / 2, 1, str(counts[k]), ha="center", va="center",
                    fontsize=LEGEND_SIZE + 1, color="white", fontweight="bold")
            left += counts[k]
    fate = fate_counts(batches, ledger)
    colours = {"in batches": "#1f77b4", "re-run in slot": "#9467bd", "wasted": "#8c8c8c",
               "still open": "#bdbdbd"}
    reasons = {r: n for r, n in ((ledger or {}).get("waste_by_reason") or {}).items() if n}
    label = dict(zip(colours, colours, strict=True))
    if len(reasons) == 1:  # one reason: say it (several: the headline lists them)
        (r,) = reasons
        label["wasted"] = f"wasted ({_WASTE_WHY.get(r, r.replace('_', ' '))})"
    left = 0
    for k, n in fate.items():
        if n:
            ax.barh(0, n, left=left, color=colours[k], label=label[k])
            ax.text(left + n / 2, 0, str(n), ha="center", va="center",
                    fontsize=LEGEND_SIZE + 1, color="white", fontweight="bold")
            left += n
    ax.set_yticks([0, 1], ["what became of\nevery launched attempt", "outcome of every\nfinished attempt"])
    ax.set_xlabel("attempts")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=8, fontsize=LEGEND_SIZE,
              frameon=False)
    return _png(fig)


def fate_counts(batches: Sequence[dict[str, Any]], ledger: dict[str, Any] | None) -> dict[str, int]:
    """Launched attempts by fate: from the run's final ledger, else the batches' accounting."""
    if ledger:
        return {"in batches": int(ledger.get("consumed", 0)) + int(ledger.get("delivered", 0)),
                "re-run in slot": int(ledger.get("retried", 0)),
                "wasted": int(ledger.get("waste", 0)),
                "still open": int(ledger.get("in_flight", 0)) + int(ledger.get("finished", 0))}
    acc = [(b.get("extra") or {}).get("accounting") or {} for b in batches]
    return {"in batches": sum(int(a.get("consumed", 0)) for a in acc),
            "re-run in slot": sum(int(a.get("retried", 0)) for a in acc),
            "wasted": sum(int(a.get("waste", 0)) for a in acc), "still open": 0}


def duration_cdf(arms: dict[str, Sequence[Trajectory]]) -> str:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, trajs in arms.items():
        ds = sorted(t.duration_s for t in trajs)
        if ds:
            ax.step(ds, [(i + 1) / len(ds) for i in range(len(ds))], where="post", label=name)
    ax.set_xlabel("trajectory duration (s)")
    ax.set_ylabel("fraction finished")
    ax.set_title("CDF of trajectory durations")
    ax.grid(alpha=0.3)
    if len(arms) > 1:  # one curve needs no legend
        ax.legend(fontsize=LEGEND_SIZE)
    return _png(fig)


def bank_fill(events: Sequence[dict[str, Any]], t0: float) -> str:
    ready: list[float] = []
    batches: list[tuple[float, int]] = []
    for e in events:
        if e.get("kind") == "group_ready":
            ready.append(float(e["t"]) - t0)
        elif e.get("kind") == "batch_ready":
            batches.append((float(e["t"]) - t0, int(e.get("groups", 0))))
    fig, ax = plt.subplots(figsize=(9, 4))
    ready.sort()
    end = max([*ready, *(t for t, _ in batches), 0.0])
    ax.step([0.0, *ready, end], [0, *range(1, len(ready) + 1), len(ready)], where="post",
            label="groups ready (cumulative)")
    taken, xs, ys = 0, [0.0], [0]
    for t, g in batches:
        xs += [t, t]
        ys += [taken, taken + g]
        taken += g
        ax.axvline(t, color="grey", ls=":", lw=1)
    ax.step(xs, ys, where="post", label="groups handed to trainer")
    ax.set_xlabel("seconds since first launch")
    ax.set_ylabel("groups")
    ax.set_title("ready-bank fill (dotted: batch hand-offs)")
    ax.legend(fontsize=LEGEND_SIZE)
    return _png(fig)
