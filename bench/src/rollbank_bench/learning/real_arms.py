"""``rollbank bench learning --compare sync=A.json,gated=B.json,ungated=C.json``: real-loop
runs of the same seeds side by side (each file a ``bench-learning-vllm-seeds.json``).

Per arm, over its seeds (per seed one number, then mean +- standard error across seeds):

- ``train_tasks_auc`` / ``held_out_auc``: **reward per sample trained on**: the solve rate
  of the trainer's saved versions (every ``--eval-every`` steps after 0, the same number of
  samples into every arm) on the training pool's tasks / the held-out tasks, averaged over
  those versions (area under the learning curve); ``train_tasks_end`` / ``held_out_end``:
  the final version's;
- ``batch_reward``: the mean verifier reward of the batches the loop trained on, i.e. what
  the *behaviour* policies scored: in async mode they are up to ``max_lag`` versions behind
  the trainer, so this lags the learning curve by construction;
- the policy age of the trained batches (mean, max), the divergence gate's decisions summed
  over the steps (admitted, down-weighted, re-run, excluded), stale batches dropped, the
  run's wall seconds and its learning verdict.

Against the ``sync`` arm, per metric: the relative gap of the means and the paired per-seed
difference (mean +- s.e.); **measurably worse** when the paired difference is below 0 by more
than 2 standard errors (>= 3 seeds), **within 5% of sync** when the gap of the means is
>= -5%.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rollbank_bench.learning.real_seeds import MIN_SEEDS, mean_se
from rollbank_bench.learning.report import TOLERANCE

GATE_KEYS = ("admitted", "downweighted", "retried", "excluded")
METRICS = ("train_tasks_auc", "held_out_auc", "train_tasks_end", "held_out_end", "batch_reward")


def parse_compare(text: str) -> dict[str, Path]:
    """``NAME=FILE,...`` -> {name: path}; a malformed item is a ValueError naming it."""
    out: dict[str, Path] = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--compare: {item!r} is not NAME=FILE.json")
        out[name] = Path(path)
    return out


def _steps(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in run.get("steps") or [] if s.get("reward_mean") is not None]


def _evals(run: dict[str, Any], key: str, name: str) -> dict[str, float | None]:
    """A run's ``{name}_auc`` (mean solve rate of its evaluated versions after 0) and
    ``{name}_end`` (its last version's)."""
    later = sorted((int(e["version"]), float(e["solve_rate"])) for e in run.get(key) or []
                   if int(e["version"]) > 0)
    rates = [r for _, r in later]
    return {f"{name}_auc": math.fsum(rates) / len(rates) if rates else None,
            f"{name}_end": rates[-1] if rates else None}


def _curve(runs: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Per evaluated version: the solve rate's mean +- s.e. across the runs that have it."""
    by: dict[int, list[float]] = {}
    for run in runs:
        for e in run.get(key) or []:
            by.setdefault(int(e["version"]), []).append(float(e["solve_rate"]))
    return [{"version": v, **mean_se(xs)} for v, xs in sorted(by.items())]


def plot(doc: dict[str, Any], path: Path) -> str:
    """The trainer's versions' solve rate on the training pool's tasks, each arm's mean +- s.e."""
    from rollbank.metrics.report import plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    for k, (name, arm) in enumerate(doc["arms"].items()):
        label = name if arm.get("mode") != "async" else (
            f"{name} (max lag {arm.get('max_lag')}, age {arm['policy_age']['mean']:.1f})")
        for axis, key in ((ax[0], "train_tasks_curve"), (ax[1], "held_out_curve")):
            pts = arm[key]
            axis.errorbar([q["version"] for q in pts], [q["mean"] for q in pts],
                          yerr=[q["se"] or 0.0 for q in pts], marker="o", capsize=3,
                          color=f"C{k}", label=label)
    ax[0].set(xlabel="trainer version (steps; the same samples into every arm)",
              ylabel="solve rate (mean +- s.e. over seeds)", title="training-pool tasks")
    ax[1].set(xlabel="trainer version", title="held-out tasks")
    ax[0].legend(fontsize=8)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path.name


def arm_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """One arm's figures from its seeds document."""
    per_seed = []
    ages: list[float] = []
    gate = dict.fromkeys(GATE_KEYS, 0)
    gate_on = False
    for run in doc["runs"]:
        steps = _steps(run)
        rewards = [float(s["reward_mean"]) for s in steps]
        run_ages = [float(s.get("policy_age") or 0) for s in steps]
        ages += run_ages
        for s in steps:
            g = s.get("gate") or {}
            gate_on = gate_on or bool(g.get("enabled"))
            for k in GATE_KEYS:
                gate[k] += int(g.get(k) or 0)
        per_seed.append({
            "seed": run["settings"]["seed"], "steps": len(steps),
            "batch_reward": math.fsum(rewards) / len(rewards) if rewards else None,
            **_evals(run, "train_evals", "train_tasks"), **_evals(run, "evals", "held_out"),
            "age_mean": math.fsum(run_ages) / len(run_ages) if run_ages else None,
            "age_max": max(run_ages, default=None), "stale_batches": run.get("stale_batches"),
            "run_seconds": run.get("run_seconds")})
    return {
        **{m: mean_se([p[m] for p in per_seed if p[m] is not None]) for m in METRICS},
        "eval_versions": sorted({int(e["version"]) for run in doc["runs"]
                                 for e in run.get("train_evals") or []}),
        "train_tasks_curve": _curve(doc["runs"], "train_evals"),
        "held_out_curve": _curve(doc["runs"], "evals"),
        "policy_age": {"mean": math.fsum(ages) / len(ages) if ages else None,
                       "max": max(ages, default=None)},
        "gate": {"enabled": gate_on, **gate},
        "stale_batches": sum(int(p["stale_batches"] or 0) for p in per_seed),
        "run_seconds": (math.fsum(p["run_seconds"] for p in per_seed)
                        if all(p["run_seconds"] is not None for p in per_seed) else None),
        "verdict": doc.get("verdict"),
        "trainer_step_s": (doc.get("settings") or {}).get("trainer_step_s"),
        "max_lag": (doc.get("settings") or {}).get("lag"),
        "mode": (doc.get("settings") or {}).get("mode"),
        "per_seed": per_seed,
    }


def versus(arm: dict[str, Any], sync: dict[str, Any]) -> dict[str, Any]:
    """``arm`` against ``sync``, per metric: gap of the means, paired per-seed difference,
    the tests."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        a, s = arm[metric]["mean"], sync[metric]["mean"]
        gap = None if a is None or not s else (a - s) / s
        base = {p["seed"]: p[metric] for p in sync["per_seed"]}
        diffs = [p[metric] - base[p["seed"]] for p in arm["per_seed"]
                 if p[metric] is not None and base.get(p["seed"]) is not None]
        d = mean_se(diffs)
        m, se = d["mean"], d["se"]
        worse = len(diffs) >= MIN_SEEDS and m is not None and se is not None and m + 2 * se < 0
        out[metric] = {"gap_of_means": gap, "paired_diff": d,
                       "within_5pct_of_sync": gap is not None and gap >= -TOLERANCE,
                       "measurably_worse": bool(worse)}
    return out


def compare(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every arm's summary and, when a ``sync`` arm is given, each other arm against it."""
    if not docs:
        raise ValueError("--compare: no runs given")
    arms = {name: arm_summary(doc) for name, doc in docs.items()}
    if "sync" in arms:
        for name, arm in arms.items():
            if name != "sync":
                arm["vs_sync"] = versus(arm, arms["sync"])
    seeds = {name: sorted(str(p["seed"]) for p in a["per_seed"]) for name, a in arms.items()}
    return {"bench": "learning (real loop, arms side by side)", "arms": arms, "seeds": seeds,
            "same_seeds": len({tuple(v) for v in seeds.values()}) == 1,
            "test": "per seed one number per metric, mean +- s.e. across seeds; *_auc = mean "
                    "solve rate of the trainer's versions after 0 (reward per sample trained "
                    "on), *_end = the final version's, batch_reward = the behaviour policies' "
                    "batches; measurably worse = paired difference vs sync below 0 by > 2 s.e. "
                    "(>= 3 seeds); within 5% = gap of the means >= -5%"}


def compare_files(text: str) -> dict[str, Any]:
    """``--compare``'s document: the named seeds documents read and compared."""
    paths = parse_compare(text)
    docs: dict[str, dict[str, Any]] = {}
    for name, path in paths.items():
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"--compare {name}={path}: {exc}") from exc
        if not isinstance(doc, dict) or "runs" not in doc:
            raise ValueError(f"--compare {name}={path}: not a bench-learning-vllm-seeds.json "
                             "(no 'runs')")
        docs[name] = doc
    out = compare(docs)
    out["files"] = {name: str(p) for name, p in paths.items()}
    return out
