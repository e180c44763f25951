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
summaries), so a report can be regenerated from an output folder (:func:`report_from_run_dir`).

Invariants: one self-contained HTML file (no external assets); matplotlib runs headless (Agg)
and every figure is closed after rendering.

matplotlib comes from the ``report`` extra (``pip install 'rollbank[report]'``); it is imported
at the first plot, so importing this module works without it, and a missing matplotlib is a
:class:`~rollbank.extras.MissingExtraError` naming the extra.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollbank.episodes.spans import spans_of
from rollbank.episodes.trajectory import Trajectory
from rollbank.metrics.gate_report import GATE_COLUMNS, gate_rows, gate_totals
from rollbank.metrics.progress import _WASTE_WHY
from rollbank.metrics.report_plots import (
    _lanes,
    attempts_at_a_glance,
    bank_fill,
    duration_cdf,
    fate_counts,
    plt,
    sandbox_timeline,
    server_rows,
    server_timeline,
)

__all__ = ["_lanes", "duration_cdf", "fmt_cell", "fmt_number", "headline", "plt", "server_rows",
           "write_report"]


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


#: table headers for people (the JSON key stays in the header's tooltip)
LABELS = {
    "batch_index": "batch", "n_groups": "groups", "n_trajectories": "trajectories",
    "time_to_batch_s": "time to batch (s)", "tail_share": "straggler tail share",
    "tokens_per_s": "tokens/s", "inference_busy_s": "servers busy (s)",
    "inference_idle_env_s": "servers idle while episodes in sandboxes (s)",
    "sandbox_held_util": "sandbox utilisation", "prefix_cache_hit_rate": "prefix cache hit rate",
    "efficiency": "efficiency T_LB / T", "critical_path_s": "critical path (s)",
    "inference_work_s": "inference work (s)", "sandbox_work_s": "sandbox work (s)",
    "t_lb_s": "T_LB (s)", "binding_term": "bound by", "groups_in_pool": "groups in pool",
    "groups_needed": "groups needed",
}
#: span kinds in the words of the sandbox timeline's legend
PHASES = {"sandbox_setup": "sandbox set-up", "inference": "waiting for the model",
          "exec": "tool commands", "verify": "verifier"}


def _table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    head = "".join(f"<th title='{html.escape(c)}'>{html.escape(LABELS.get(c, c))}</th>"
                   for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{fmt_cell(r.get(c))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


BATCH_COLUMNS = ("batch_index", "n_groups", "n_trajectories", "time_to_batch_s", "tail_share",
                 "tokens_per_s", "inference_busy_s", "inference_idle_env_s", "sandbox_held_util",
                 "prefix_cache_hit_rate", "efficiency")
OUTCOMES = ("model_success", "model_failure", "infra_failure", "unknown")


def outcome_rows(batches: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per batch the accepted trajectories by outcome, and the batch's attempt accounting."""
    rows = []
    for b in batches:
        oc = b.get("outcomes") or {}
        acc = (b.get("extra") or {}).get("accounting") or {}
        rows.append({"batch": b.get("batch_index"), **{k: int(oc.get(k, 0)) for k in OUTCOMES},
                     "launched in window": acc.get("launched"), "in the batch": acc.get("consumed"),
                     "re-run": acc.get("retried"), "wasted": acc.get("waste"),
                     "carried to next window": acc.get("carried")})
    return rows


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else "-"


def headline(batches: Sequence[dict[str, Any]], trajectories: Sequence[Trajectory],
             setup_s: float | None = None, ledger: dict[str, Any] | None = None
             ) -> list[tuple[str, str]]:
    """The top-of-report block: (label, text) rows for time to batch, efficiency and its
    binding term, outcomes and learning signal, and where the time went."""
    rows: list[tuple[str, str]] = []
    groups = zero = 0
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
        rows.append(("outcomes in batches", f"{total} trajectories: " + ", ".join(
            f"{k} {n} ({_pct(n, total)})" for k, n in sorted(outcomes.items())) if total else "-"))
    if trajectories:
        every: dict[str, int] = {}
        for t in trajectories:
            k = t.outcome.outcome.value if t.outcome is not None else "running"
            every[k] = every.get(k, 0) + 1
        rows.append(("outcomes of all finished attempts", f"{len(trajectories)} attempts: " + ", ".join(
            f"{k} {n} ({_pct(n, len(trajectories))})" for k, n in sorted(every.items()))))
    if ledger:
        fate = fate_counts(batches, ledger)
        launched = int(ledger.get("launched", sum(fate.values())))
        why = ", ".join(f"{n} {_WASTE_WHY.get(r, r.replace('_', ' '))}" for r, n in
                        sorted((ledger.get("waste_by_reason") or {}).items()) if n)
        rows.append(("attempts", f"{launched} launched: " + ", ".join(
            f"{n} {k} ({_pct(n, launched)}" + (f": {why})" if k == "wasted" and why else ")")
            for k, n in fate.items() if n)))
    if groups and any("zero_variance_groups" in (b.get("extra") or {}) for b in batches):
            rows.append(("reward variance", f"{groups - zero}/{groups} groups with reward variance "
                                            f"({_pct(groups - zero, groups)}); {zero} zero-variance"))
    if trajectories:
        held = sum(t.duration_s for t in trajectories)
        by_kind = {k: sum(s.duration for t in trajectories for s in spans_of(t, k))
                   for k in ("sandbox_setup", "inference", "exec", "verify")}
        rest = max(held - sum(by_kind.values()), 0.0)
        parts = [f"{PHASES[k]} {fmt_number(v)} s ({_pct(v, held)})" for k, v in by_kind.items()]
        rows.append(("where time went", f"{len(trajectories)} attempts held sandboxes "
                     f"{fmt_number(held)} s: " + ", ".join(parts)
                     + f", held between phases {fmt_number(rest)} s ({_pct(rest, held)})"))
    if batches:
        busy = sum(float(b.get("inference_busy_s", 0.0)) for b in batches)
        span = sum(float(b.get("time_to_batch_s", 0.0)) * int(b.get("num_servers", 1) or 1) for b in batches)
        idle_env = sum(float(b.get("inference_idle_env_s", 0.0)) for b in batches)
        rows.append(("servers", f"busy {_pct(busy, span)} of server time; idle while episodes were in "
                                f"sandboxes {fmt_number(idle_env)} s"))
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
    ledger: dict[str, Any] | None = None,
    interrupted: str | None = None,
) -> Path:
    """Write the HTML report; ``batches`` are :meth:`BatchSummary.to_dict` rows, ``ledger``
    the run's final attempt accounting, ``interrupted`` why the run stopped early."""
    t0 = min((t.launched_at for t in trajectories), default=0.0)
    figs: list[tuple[str, str]] = []
    if trajectories:
        figs.append(("Timeline per inference server", server_timeline(trajectories, t0, batches)))
        figs.append(("Timeline per sandbox", sandbox_timeline(trajectories, t0, batches)))
        figs.append(("Trajectory durations", duration_cdf({"all": trajectories})))
    figs.append(("Ready bank", bank_fill(events, t0)))
    lb_rows = [{"batch_index": b["batch_index"], **b.get("lower_bound", {})} for b in batches]
    glance = ([f"<img src='data:image/png;base64,"
               f"{attempts_at_a_glance(trajectories, batches, ledger)}'/>"] if trajectories else [])
    stop = ([f"<p class='stop'>Interrupted ({html.escape(interrupted)}): this report covers the "
             f"{len(batches)} batch(es) written and the attempts finished before the stop.</p>"]
            if interrupted else [])
    parts = [
        f"<h1>{html.escape(title)}</h1>", *stop,
        _headline_html(headline(batches, trajectories, setup_s, ledger)),
        *(f"<p>{html.escape(n)}</p>" for n in notes),
        "<h2>Attempts at a glance</h2>", *glance,
        "<h2>Outcomes per batch</h2>",
        "<p>Accepted trajectories by outcome, and what happened to the attempts launched in the "
        "batch's window.</p>", _table(outcome_rows(batches), ["batch", *OUTCOMES,
                                                              "launched in window", "in the batch",
                                                              "re-run", "wasted",
                                                              "carried to next window"]),
        "<h2>Batches</h2>", _table(batches, BATCH_COLUMNS),
        "<h2>Lower bound T_LB per batch</h2>",
        _table(lb_rows, ("batch_index", "critical_path_s", "inference_work_s", "sandbox_work_s",
                         "t_lb_s", "binding_term", "groups_in_pool", "groups_needed")),
        *_gate_section(batches),
        *(f"<h2>{html.escape(name)}</h2><img src='data:image/png;base64,{png}'/>"
          for name, png in figs),
    ]
    if config is not None:
        parts += ["<details><summary>Resolved configuration (config.resolved.json)</summary>",
                  f"<pre>{html.escape(json.dumps(config, indent=2, sort_keys=True, default=str))}"
                  "</pre></details>"]
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}img{max-width:100%}"
             ".headline th{text-align:left;background:#f4f4f4}.headline td{font-size:14px}"
             ".stop{background:#fde0dd;padding:6px;border:1px solid #d62728}"
             "summary{cursor:pointer;font-weight:bold;margin-top:1em}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>"
                    f"{html.escape(title)}</title><style>{style}</style></head><body>"
                    + "\n".join(parts) + "</body></html>\n", encoding="utf-8")
    return path


def trajectory_from_episode(doc: dict[str, Any]) -> Trajectory:
    """The parts of a trajectory the report draws (ids, times, spans, outcome), read back from
    an episode file's JSON (``episodes/*.json``: ``rollbank.episodes.replay.episode_record``)."""
    from rollbank.episodes.episode_file import parse_episode
    from rollbank.episodes.spans import Span, add_span

    rec = parse_episode(doc)
    timings = doc.get("timings") or {}
    t = Trajectory(trajectory_id=rec.trajectory_id, group_id=rec.group_id, task_id=rec.task_id,
                   attempt=int(doc.get("attempt", 0)), retry=int(doc.get("retry", 0)),
                   launched_at=float(timings.get("launched_at", 0.0)),
                   started_at=float(timings.get("started_at", 0.0)),
                   finished_at=float(timings.get("finished_at", 0.0)),
                   outcome=rec.outcome.to_outcome() if rec.outcome is not None else None)
    for s in doc.get("spans") or []:
        add_span(t, Span(**s))
    return t


def report_from_run_dir(run_dir: Path, out: Path | None = None) -> Path:
    """Write (again) the report of a collect output folder from what it holds: summary.json,
    events.jsonl, episodes/*.json and config.resolved.json (default: ``<run_dir>/report.html``)."""
    from rollbank.config import read_json_input
    from rollbank.metrics.events import read_events

    summary = read_json_input(run_dir / "summary.json", what="summary file")
    trajs = [trajectory_from_episode(read_json_input(p, what="episode file"))
             for p in sorted((run_dir / "episodes").glob("*.json"))]
    config_file = run_dir / "config.resolved.json"
    config = read_json_input(config_file, what="config") if config_file.is_file() else None
    batches = list(summary.get("batches") or [])
    setup_s = float(summary.get("setup_s") or 0.0)
    return write_report(
        out or run_dir / "report.html", title=f"rollbank collect: {run_dir.name}",
        trajectories=trajs, events=read_events(run_dir / "events.jsonl"), batches=batches,
        config=config, setup_s=setup_s, ledger=summary.get("ledger"),
        interrupted=summary.get("interrupted"),
        notes=[f"collection {float(summary.get('collection_s') or 0.0):.1f} s for {len(batches)} "
               f"batch(es); {len(trajs)} attempts finished; set-up {setup_s:.1f} s"])
