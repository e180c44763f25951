"""The HTML report of a collection: per-batch table and plots embedded as PNG.

Plots: a timeline of trajectories per inference server (inference spans) and per sandbox lane
(episode phases: set-up, tool, waiting on inference, verify), the CDF of trajectory durations,
and the ready-bank fill curve (groups ready vs groups handed over, batch boundaries marked).
Inputs are the records a run leaves behind (trajectories with spans, the JSONL events, batch
summaries), so a report can be regenerated from an output folder.

Invariants: one self-contained HTML file (no external assets); matplotlib runs headless (Agg)
and every figure is closed after rendering.

matplotlib comes from the ``report`` extra (``pip install 'rollbank[report]'``); it is imported
at the first plot, so importing this module works without it, and a missing matplotlib is a
:class:`~rollbank.extras.MissingExtraError` naming the extra.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollbank.episodes.spans import spans_of
from rollbank.episodes.trajectory import Trajectory
from rollbank.extras import require


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

_PHASE_COLOURS = {"sandbox_setup": "#8c564b", "exec": "#2ca02c", "verify": "#9467bd",
                  "inference": "#1f77b4"}


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _lanes(intervals: Sequence[tuple[float, float, Trajectory]]) -> list[int]:
    """Greedy interval packing: lane index per interval (a lane = one sandbox slot in use)."""
    ends: list[float] = []
    out: list[int] = []
    for a, b, _ in intervals:
        for i, e in enumerate(ends):
            if e <= a:
                ends[i] = b
                out.append(i)
                break
        else:
            ends.append(b)
            out.append(len(ends) - 1)
    return out


def server_timeline(trajs: Sequence[Trajectory], t0: float) -> str:
    spans = [s for t in trajs for s in spans_of(t, "inference")]
    servers = sorted({s.server or "?" for s in spans})
    fig, ax = plt.subplots(figsize=(11, 0.6 + 0.5 * max(len(servers), 1)))
    ids = sorted({s.trajectory_id for s in spans})
    cmap = plt.get_cmap("tab20")
    colour = {tid: cmap(i % 20) for i, tid in enumerate(ids)}
    for s in spans:
        y = servers.index(s.server or "?")
        ax.barh(y, s.duration, left=s.start - t0, height=0.8, color=colour[s.trajectory_id],
                edgecolor="none")
    ax.set_yticks(range(len(servers)), servers)
    ax.set_xlabel("seconds since first launch")
    ax.set_title("inference requests per server (colour = trajectory)")
    return _png(fig)


def sandbox_timeline(trajs: Sequence[Trajectory], t0: float) -> str:
    eps = sorted(((t.launched_at, t.finished_at, t) for t in trajs), key=lambda x: x[0])
    lanes = _lanes(eps)
    fig, ax = plt.subplots(figsize=(11, 1 + 0.12 * max(max(lanes, default=0) + 1, 8)))
    for (a, b, t), lane in zip(eps, lanes, strict=True):
        ax.barh(lane, b - a, left=a - t0, height=0.9, color="#dddddd", edgecolor="none")
        for s in spans_of(t):
            if s.kind in _PHASE_COLOURS:
                ax.barh(lane, s.duration, left=s.start - t0, height=0.9,
                        color=_PHASE_COLOURS[s.kind], edgecolor="none")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _PHASE_COLOURS.values()]
    ax.legend(handles, list(_PHASE_COLOURS), loc="upper right", fontsize=7)
    ax.set_xlabel("seconds since first launch")
    ax.set_ylabel("sandbox lane")
    ax.set_title("trajectories per sandbox lane (grey = held, idle)")
    return _png(fig)


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
    ax.legend(fontsize=8)
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
    ax.legend(fontsize=8)
    return _png(fig)


def _table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3f}"
        if isinstance(v, dict):
            return html.escape(json.dumps(v, sort_keys=True, default=str))
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{fmt(r.get(c))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


BATCH_COLUMNS = ("batch_index", "n_groups", "n_trajectories", "time_to_batch_s", "tail_share",
                 "tokens_per_s", "inference_busy_s", "inference_idle_env_s", "sandbox_held_util",
                 "prefix_cache_hit_rate", "efficiency", "outcomes")


def write_report(
    path: Path,
    *,
    title: str,
    trajectories: Sequence[Trajectory],
    events: Sequence[dict[str, Any]],
    batches: Sequence[dict[str, Any]],
    config: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> Path:
    """Write the HTML report; ``batches`` are :meth:`BatchSummary.to_dict` rows."""
    t0 = min((t.launched_at for t in trajectories), default=0.0)
    figs: list[tuple[str, str]] = []
    if trajectories:
        figs.append(("Timeline per inference server", server_timeline(trajectories, t0)))
        figs.append(("Timeline per sandbox", sandbox_timeline(trajectories, t0)))
        figs.append(("Trajectory durations", duration_cdf({"all": trajectories})))
    figs.append(("Ready bank", bank_fill(events, t0)))
    lb_rows = [{"batch_index": b["batch_index"], **b.get("lower_bound", {})} for b in batches]
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        *(f"<p>{html.escape(n)}</p>" for n in notes),
        "<h2>Batches</h2>", _table(batches, BATCH_COLUMNS),
        "<h2>Lower bound T_LB per batch</h2>",
        _table(lb_rows, ("batch_index", "critical_path_s", "inference_work_s", "sandbox_work_s",
                         "t_lb_s", "binding_term", "groups_in_pool", "groups_needed")),
        *(f"<h2>{html.escape(name)}</h2><img src='data:image/png;base64,{png}'/>"
          for name, png in figs),
    ]
    if config is not None:
        parts += ["<h2>Resolved configuration</h2>",
                  f"<pre>{html.escape(json.dumps(config, indent=2, sort_keys=True, default=str))}</pre>"]
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}img{max-width:100%}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>"
                    f"{html.escape(title)}</title><style>{style}</style></head><body>"
                    + "\n".join(parts) + "</body></html>\n", encoding="utf-8")
    return path
