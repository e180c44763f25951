"""The HTML report of a collection: a headline block, per-batch tables and plots embedded as PNG.

The headline (top of the page) says how long each batch took, its efficiency T_LB / T and the
binding term of the bound, the outcomes and the share of groups with reward variance, and where
the time went (sandbox set-up, inference, tools, verify, other; server busy share). Numbers are
shown with 3 significant digits (:func:`fmt_number`), also inside nested table cells.

Plots: a timeline of requests per inference server (requests in flight at once are stacked in
sub-lanes of the server's band) and per sandbox lane
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

from rollbank.episodes.spans import Span, spans_of
from rollbank.episodes.trajectory import Trajectory
from rollbank.extras import require
from rollbank.metrics.gate_report import GATE_COLUMNS, gate_rows, gate_totals


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


def server_timeline(trajs: Sequence[Trajectory], t0: float) -> str:
    spans = [s for t in trajs for s in spans_of(t, "inference")]
    servers, placed = server_rows(spans)
    fig, ax = plt.subplots(figsize=(11, 0.8 + 0.9 * max(len(servers), 1)))
    ids = sorted({s.trajectory_id for s in spans})
    cmap = plt.get_cmap("tab20")
    colour = {tid: cmap(i % 20) for i, tid in enumerate(ids)}
    for s, y, h in placed:
        ax.barh(y, s.duration, left=s.start - t0, height=h, color=colour[s.trajectory_id],
                edgecolor="none")
    ax.set_yticks(range(len(servers)), servers)
    ax.set_xlabel("seconds since first launch")
    ax.set_title("inference requests per server (one sub-lane per concurrent request; "
                 "colour = trajectory)")
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


def fmt_number(v: float) -> str:
    """A float for people: 3 significant digits below 100, no decimals above (no 15-digit
    reprs); integers stay integers."""
    if v != v or v in (float("inf"), float("-inf")):
        return str(v)
    if v == int(v) and abs(v) >= 100:
        return f"{int(v)}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def _short(v: Any) -> Any:
    """Floats inside nested containers rounded to 3 significant digits for display."""
    if isinstance(v, float):
        return float(f"{v:.3g}") if abs(v) < 100 else round(v)
    if isinstance(v, dict):
        return {k: _short(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_short(x) for x in v]
    return v


def fmt_cell(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return html.escape(str(v) if v is not None else "-")
    if isinstance(v, float):
        return fmt_number(v)
    if isinstance(v, dict | list | tuple):
        return html.escape(json.dumps(_short(v), sort_keys=True, default=str))
    return html.escape(str(v))


def _table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{fmt_cell(r.get(c))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


BATCH_COLUMNS = ("batch_index", "n_groups", "n_trajectories", "time_to_batch_s", "tail_share",
                 "tokens_per_s", "inference_busy_s", "inference_idle_env_s", "sandbox_held_util",
                 "prefix_cache_hit_rate", "efficiency", "outcomes")


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else "-"


def headline(batches: Sequence[dict[str, Any]], trajectories: Sequence[Trajectory],
             setup_s: float | None = None) -> list[tuple[str, str]]:
    """The top-of-report block: (label, text) rows for time to batch, efficiency and its
    binding term, outcomes and learning signal, and where the time went."""
    rows: list[tuple[str, str]] = []
    if batches:
        ttb = ", ".join(f"#{b.get('batch_index')} {fmt_number(float(b.get('time_to_batch_s', 0.0)))} s"
                        for b in batches[:6])
        more = f" (+{len(batches) - 6} more)" if len(batches) > 6 else ""
        setup = f"; set-up before the clock {fmt_number(setup_s)} s" if setup_s is not None else ""
        rows.append(("time to batch", ttb + more + setup))
        effs = []
        for b in batches[:6]:
            lb = b.get("lower_bound") or {}
            if b.get("efficiency") is None:
                effs.append(f"#{b.get('batch_index')} - (servers not calibrated)")
            else:
                effs.append(f"#{b.get('batch_index')} {b['efficiency']:.2f}, bound by "
                            f"{lb.get('binding_term', '?')} (T_LB {fmt_number(float(lb.get('t_lb_s', 0.0)))} s)")
        rows.append(("efficiency T_LB / T", "; ".join(effs)))
        outcomes: dict[str, int] = {}
        groups = zero = 0
        for b in batches:
            for k, n in (b.get("outcomes") or {}).items():
                outcomes[k] = outcomes.get(k, 0) + int(n)
            groups += int(b.get("n_groups", 0))
            zero += int((b.get("extra") or {}).get("zero_variance_groups", 0))
        total = sum(outcomes.values())
        rows.append(("outcomes", ", ".join(f"{k} {n} ({_pct(n, total)})" for k, n in sorted(outcomes.items()))
                     or "-"))
        if groups and any("zero_variance_groups" in (b.get("extra") or {}) for b in batches):
            rows.append(("learning signal", f"{groups - zero}/{groups} groups with reward variance "
                                            f"({_pct(groups - zero, groups)}); {zero} zero-variance"))
    if trajectories:
        held = sum(t.duration_s for t in trajectories)
        by_kind = {k: sum(s.duration for t in trajectories for s in spans_of(t, k))
                   for k in ("sandbox_setup", "inference", "exec", "verify")}
        rest = max(held - sum(by_kind.values()), 0.0)
        parts = [f"{k} {fmt_number(v)} s ({_pct(v, held)})" for k, v in by_kind.items()]
        rows.append(("where time went", f"{len(trajectories)} trajectories, {fmt_number(held)} s in sandboxes: "
                     + ", ".join(parts) + f", other {fmt_number(rest)} s ({_pct(rest, held)})"))
    if batches:
        busy = sum(float(b.get("inference_busy_s", 0.0)) for b in batches)
        span = sum(float(b.get("time_to_batch_s", 0.0)) * int(b.get("num_servers", 1) or 1) for b in batches)
        idle_env = sum(float(b.get("inference_idle_env_s", 0.0)) for b in batches)
        rows.append(("servers", f"busy {_pct(busy, span)} of server time; idle while episodes were in "
                                f"environments {fmt_number(idle_env)} s"))
    return rows


def _headline_html(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table class='headline'>{body}</table>"


def _gate_section(batches: Sequence[dict[str, Any]]) -> list[str]:
    """The staleness gate's decisions per batch (nothing when the run had the gate off)."""
    rows = gate_rows(batches)
    if not rows:
        return []
    t = gate_totals(rows)
    ess_min = "-" if t["ess_min"] is None else fmt_number(float(t["ess_min"]))
    k3 = "-" if t["k3_mean"] is None else (f"{fmt_number(float(t['k3_mean']))} mean, "
                                           f"{fmt_number(float(t['k3_max']))} max")
    line = (f"{t['judged']} attempts judged: {t['admitted']} admitted, {t['downweighted']} "
            f"down-weighted, {t['retried']} dropped and re-run, {t['stale_final']} dropped for good "
            f"(stale_final), {t['rare_success_kept']} rare successes kept; batch token k3 {k3}; "
            f"token ESS min {ess_min}")
    return ["<h2>Staleness gate per batch</h2>", f"<p>{html.escape(line)}</p>",
            _table(rows, GATE_COLUMNS)]


def write_report(
    path: Path,
    *,
    title: str,
    trajectories: Sequence[Trajectory],
    events: Sequence[dict[str, Any]],
    batches: Sequence[dict[str, Any]],
    config: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
    setup_s: float | None = None,
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
        _headline_html(headline(batches, trajectories, setup_s)),
        *(f"<p>{html.escape(n)}</p>" for n in notes),
        "<h2>Batches</h2>", _table(batches, BATCH_COLUMNS),
        "<h2>Lower bound T_LB per batch</h2>",
        _table(lb_rows, ("batch_index", "critical_path_s", "inference_work_s", "sandbox_work_s",
                         "t_lb_s", "binding_term", "groups_in_pool", "groups_needed")),
        *_gate_section(batches),
        *(f"<h2>{html.escape(name)}</h2><img src='data:image/png;base64,{png}'/>"
          for name, png in figs),
    ]
    if config is not None:
        parts += ["<h2>Resolved configuration</h2>",
                  f"<pre>{html.escape(json.dumps(config, indent=2, sort_keys=True, default=str))}</pre>"]
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}img{max-width:100%}"
             ".headline th{text-align:left;background:#f4f4f4}.headline td{font-size:14px}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>"
                    f"{html.escape(title)}</title><style>{style}</style></head><body>"
                    + "\n".join(parts) + "</body></html>\n", encoding="utf-8")
    return path
