"""Numbers and curves of the learning-integrity experiment (pure summaries + matplotlib PNGs).

Comparison "per sample": every arm trains on the same prompts in the same order, so eval point
``k`` of every arm comes after the same number of samples. An arm's score is the mean eval
solve rate over the eval points after step 0 (the area under its reward-vs-samples curve,
``auc``), and its final eval solve rate; the gap to sync is ``(arm - sync) / sync``, and the
arm is "within 5 %" when its ``auc`` gap is >= -5 %. Learning itself is ``sync auc - start``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollbank.metrics.report import plt

TOLERANCE = 0.05


def auc(arm: dict[str, Any]) -> float:
    pts = [e["solve_rate"] for e in arm["evals"][1:]] or [arm["evals"][0]["solve_rate"]]
    return float(sum(pts) / len(pts))


def mean_train_reward(arm: dict[str, Any]) -> float:
    rs = [s["reward"] for s in arm["steps"]]
    return sum(rs) / len(rs) if rs else 0.0


def pipelined_wall(arm: dict[str, Any]) -> float:
    """Modelled wall time had sampling overlapped training (async arms): per step, the longer
    of (sampling + scoring) and the trainer step; sync arms: their sum (no overlap)."""
    total = 0.0
    for s in arm["steps"]:
        gen, train = s["sample_seconds"] + s["score_seconds"], s["train_seconds"]
        total += max(gen, train) if arm["lag"] > 0 else gen + train
    return total


def _gap(value: float, ref: float) -> float | None:
    return (value - ref) / ref if ref > 0 else None


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def arm_summary(arm: dict[str, Any], sync: dict[str, Any] | None) -> dict[str, Any]:
    steps = arm["steps"]
    out: dict[str, Any] = {
        "arm": arm["arm"], "lag": arm["lag"], "gated": arm["gated"], "seed": arm.get("seed"),
        "correction": arm["correction"], "start_solve_rate": arm["evals"][0]["solve_rate"],
        "final_solve_rate": arm["evals"][-1]["solve_rate"], "auc": auc(arm),
        "mean_train_reward": mean_train_reward(arm), "samples": steps[-1]["samples"] if steps else 0,
        "wall_seconds": arm["wall_seconds"], "pipelined_wall_seconds": pipelined_wall(arm),
        "k3_mean": _mean([s["divergence"]["k3"] for s in steps]),
        "k3_max": max((s["divergence"]["k3"] for s in steps), default=None),
        "ess_mean": _mean([s["divergence"]["ess"] for s in steps]),
        "ess_min": min((s["divergence"]["ess"] for s in steps), default=None),
        "zero_variance_groups": sum(s["zero_variance_groups"] for s in steps),
        "gate_totals": arm.get("gate_totals"),
    }
    if arm["gated"]:
        out["k3_before_gate_mean"] = _mean([s["divergence_before_gate"]["k3"] for s in steps])
    if sync is not None:
        out["auc_gap_vs_sync"] = _gap(out["auc"], auc(sync))
        out["final_gap_vs_sync"] = _gap(out["final_solve_rate"], sync["evals"][-1]["solve_rate"])
        gap = out["auc_gap_vs_sync"]
        out["within_5pct_of_sync"] = gap is not None and gap >= -TOLERANCE
    return out


def verdict(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The experiment's answer (per seed, then overall), from the arm summaries."""
    by_seed: dict[Any, dict[str, dict[str, Any]]] = {}
    for s in summaries:
        by_seed.setdefault(s["seed"], {})[s["arm"]] = s
    per_seed = []
    for seed, arms in sorted(by_seed.items()):
        sync = arms.get("sync")
        learned = sync is not None and sync["auc"] > sync["start_solve_rate"]
        sweep = sorted((a for a in arms.values() if not a["gated"] and a["lag"] > 0),
                       key=lambda a: a["lag"])
        degraded = [a["lag"] for a in sweep if (a.get("auc_gap_vs_sync") or 0.0) < -TOLERANCE]
        gated = arms.get("gated")
        per_seed.append({
            "seed": seed, "sync_learned": learned,
            "sync_gain": (sync["auc"] - sync["start_solve_rate"]) if sync else None,
            "gated_auc_gap": gated.get("auc_gap_vs_sync") if gated else None,
            "gated_within_5pct": gated.get("within_5pct_of_sync") if gated else None,
            "ungated_gaps_by_lag": {str(a["lag"]): a.get("auc_gap_vs_sync") for a in sweep},
            "first_degraded_lag": degraded[0] if degraded else None,
        })
    return {"tolerance": TOLERANCE, "per_seed": per_seed}


def _eval_xy(arm: dict[str, Any], key: str) -> tuple[list[float], list[float]]:
    return [e.get(key, 0.0) for e in arm["evals"]], [e["solve_rate"] for e in arm["evals"]]


def write_plots(arms: Sequence[dict[str, Any]], out: Path) -> list[str]:
    """reward_vs_samples.png, reward_vs_wall.png, divergence.png, gate.png in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    names = []
    label = [f"{a['arm']} (seed {a.get('seed')})" for a in arms]
    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    for a, lab in zip(arms, label, strict=True):
        ax[0].plot(*_eval_xy(a, "samples"), marker="o", ms=3, label=lab)
        ax[1].plot([s["samples"] for s in a["steps"]], _smooth([s["reward"] for s in a["steps"]]), label=lab)
    ax[0].set(xlabel="training samples", ylabel="eval solve rate", title="eval reward vs samples")
    ax[1].set(xlabel="training samples", ylabel="train reward (5-step mean)", title="train reward vs samples")
    ax[0].legend(fontsize=7)
    names.append(_save(fig, out / "reward_vs_samples.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for a, lab in zip(arms, label, strict=True):
        ax.plot(*_eval_xy(a, "wall"), marker="o", ms=3, label=lab)
    ax.set(xlabel="wall seconds (measured, sequential in-process)", ylabel="eval solve rate")
    ax.legend(fontsize=7)
    names.append(_save(fig, out / "reward_vs_wall.png"))
    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    for a, lab in zip(arms, label, strict=True):
        xs = [s["step"] for s in a["steps"]]
        ax[0].plot(xs, [max(s["divergence"]["k3"], 1e-9) for s in a["steps"]], label=lab)
        ax[1].plot(xs, [s["divergence"]["ess"] for s in a["steps"]], label=lab)
    ax[0].set(xlabel="step", ylabel="token k3 (trained batch)", yscale="log", title="divergence")
    ax[1].set(xlabel="step", ylabel="token ESS (normalised)", title="effective sample size")
    ax[0].legend(fontsize=7)
    names.append(_save(fig, out / "divergence.png"))
    gated = [a for a in arms if a["gated"]]
    if gated:
        fig, ax = plt.subplots(figsize=(6, 4))
        for a in gated:
            xs = [s["step"] for s in a["steps"]]
            for key in ("admitted", "downweighted", "retried"):
                ax.plot(xs, [s["gate"][key] for s in a["steps"]], label=f"{key} (seed {a.get('seed')})")
        ax.set(xlabel="step", ylabel="trajectories", title="gate decisions per step")
        ax.legend(fontsize=7)
        names.append(_save(fig, out / "gate.png"))
    return names


def write_mean_plot(across: dict[str, Any], out: Path) -> list[str]:
    """reward_vs_samples_mean.png: per arm the mean eval solve rate across seeds ± 1 standard
    error (:func:`rollbank_bench.learning.aggregate.aggregate`); nothing for a single seed."""
    arms = across.get("arms", {})
    if not arms or max(len(a["seeds"]) for a in arms.values()) < 2:
        return []
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, a in arms.items():
        xs = [p["samples"] for p in a["curve"]]
        ms = [p["mean"] for p in a["curve"]]
        se = [p["se"] or 0.0 for p in a["curve"]]
        ax.errorbar(xs, ms, yerr=se, marker="o", ms=3, capsize=3,
                    label=f"{name} (lag {a['lag']}, {len(a['seeds'])} seeds)")
    ax.set(xlabel="training samples", ylabel="eval solve rate (mean ± s.e. across seeds)",
           title="eval reward vs samples, across seeds")
    ax.legend(fontsize=7)
    return [_save(fig, out / "reward_vs_samples_mean.png")]


def _smooth(xs: Sequence[float], k: int = 5) -> list[float]:
    return [sum(xs[max(0, i - k + 1): i + 1]) / len(xs[max(0, i - k + 1): i + 1]) for i in range(len(xs))]


def _save(fig: Any, path: Path) -> str:
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path.name
