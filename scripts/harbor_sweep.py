#!/usr/bin/env python3
"""Run real Harbor tasks through rollbank's Harbor environment and validate them with rollbank.

Usage (from the repo root, after scripts/setup.sh):

    .venv-harbor/bin/python scripts/harbor_sweep.py --out docs/measurements/harbor-provider-X.json \
        tests/fixtures/harbor-tasks/harbor-cookbook tests/fixtures/harbor-tasks/benchmark-template-ci

For each folder of tasks: ``harbor run --env rollbank.integrations.harbor:RollbankEnvironment``
once with the ``oracle`` agent and once with ``nop``, then ``rollbank tasks validate --json``
(the 3.11 venv's CLI) on every task. Per task it records Harbor's reward for both agents, the
verdict the task itself publishes (oracle 1 and nop 0, except the tasks listed in
``tests/fixtures/harbor-tasks/expected.json``, which documents what each publishes and why),
whether they match, and rollbank's validation result with the cause of each failure. Prints
the summary and writes everything as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENV = "rollbank.integrations.harbor:RollbankEnvironment"
EXPECTED = ROOT / "tests" / "fixtures" / "harbor-tasks" / "expected.json"


def harbor_job(tasks: Path, agent: str, jobs_dir: Path, n: int, ek: list[str]) -> dict[str, Any]:
    """Run one Harbor job; return {task name: trial summary}."""
    out = jobs_dir / f"{tasks.name}-{agent}"
    cmd = [str(ROOT / ".venv-harbor" / "bin" / "harbor"), "run", "-p", str(tasks), "-a", agent,
           "-n", str(n), "--env", ENV, "-o", str(out), "-y", "-q"]
    for kv in ek:
        cmd += ["--ek", kv]
    env = {**os.environ, "HARBOR_TELEMETRY": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.monotonic() - t0
    trials: dict[str, Any] = {}
    for result in sorted(out.glob("*/*/result.json")):
        d = json.loads(result.read_text())
        # the task folder (trial folder names are truncated; task_name may be [task] name)
        name = Path(d["config"]["task"]["path"]).name
        vr = d.get("verifier_result") or {}
        exc = d.get("exception_info") or {}
        trials[name] = {
            "rewards": vr.get("rewards"),
            "exception": exc.get("exception_type"),
            "exception_message": (exc.get("exception_message") or "")[:400] or None,
            "trial_dir": str(result.parent),
        }
    return {"command": " ".join(cmd), "wall_s": round(wall, 1), "returncode": proc.returncode,
            "stdout_tail": proc.stdout[-1500:], "stderr_tail": proc.stderr[-3000:],
            "trials": trials}


def validate(tasks: Path, jobs: int) -> dict[str, Any]:
    cmd = [str(ROOT / ".venv" / "bin" / "rollbank"), "tasks", "validate", "--json",
           "--jobs", str(jobs), str(tasks)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    out: dict[str, Any] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            out[rec["task_id"]] = rec
    return out


def reward(trial: dict[str, Any] | None) -> float | None:
    if not trial or not trial.get("rewards"):
        return None
    r = trial["rewards"]
    return float(r.get("reward", min(r.values())))


def same_verdict(got: float | None, expected: float | None) -> bool:
    """Pass/fail agree (expected None: the task decides at random or not at all)."""
    if expected is None:
        return True
    return got is not None and (got >= 1.0) == (expected >= 1.0)


def gpus_of(task_dir: Path) -> int:
    env = tomllib.loads((task_dir / "task.toml").read_text()).get("environment", {})
    return int(env.get("gpus") or 0)


def score(row: dict[str, Any], expected_all: dict[str, Any]) -> dict[str, Any]:
    """The task's own verdict (expected.json, else oracle 1 / nop 0), what this host lacks
    for it, and whether Harbor's rewards through rollbank agree."""
    task_dir = Path(row["folder_path"]) / row["task"]
    exp = {"oracle": 1.0, "nop": 0.0, **expected_all.get(row["task"], {})}
    gpus = gpus_of(task_dir)
    if gpus:
        exp.update(needs_gpus=gpus, cause=f"needs {gpus} GPU(s): Harbor refuses the task "
                   "before a trial starts (no GPU here); rollbank validates it without GPUs")
    if not any(task_dir.glob("solution/solve.*")) and not any(
            task_dir.glob("steps/*/solution/solve.*")):
        exp.update(oracle=None, valid_as_published=False, cause="no oracle solution published")
    got = {a: reward(row["harbor"][a]) for a in ("oracle", "nop")}
    row.update({
        "oracle_reward": got["oracle"], "nop_reward": got["nop"],
        "expected": {"oracle": exp["oracle"], "nop": exp["nop"]},
        "matches_task_verdict": None if gpus else all(
            same_verdict(got[a], exp[a]) for a in ("oracle", "nop")),
        "valid_as_published": exp.get("valid_as_published", True),
        "needs_network": exp.get("needs_network"),
        "needs_gpus": exp.get("needs_gpus"),
        "cause": exp.get("cause"),
    })
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    oracle_done = [r for r in rows if r["harbor"]["oracle"] and not r["harbor"]["oracle"]["exception"]]
    # validation: valid as published and no non-registry network; Harbor runs: also no GPU
    eligible = [r for r in rows if r["valid_as_published"] and not r["needs_network"]]
    runnable = [r for r in eligible if not r["needs_gpus"]]
    return {
        "tasks": len(rows),
        "oracle_trials_completed": len(oracle_done),
        "rewards_equal_task_verdicts": sum(bool(r["matches_task_verdict"]) for r in rows),
        "valid_no_network": len(eligible),
        "valid_no_network_no_gpu (Harbor-runnable here)": len(runnable),
        "oracle_trials_completed_among_those": sum(
            bool(r["harbor"]["oracle"]) and not r["harbor"]["oracle"]["exception"] for r in runnable),
        "rewards_equal_task_verdicts_among_those": sum(bool(r["matches_task_verdict"]) for r in runnable),
        "validate_ok_among_valid_no_network": sum(bool(r["validate_ok"]) for r in eligible)
        if any(r["validate_ok"] is not None for r in rows) else "not run (--no-validate)",
        "validate_failures_among_valid_no_network": {
            r["task"]: {"error": (r["validate_error"] or "")[:300], "cause": r["cause"]}
            for r in eligible if r["validate_ok"] is False},
        "mismatches_among_runnable": {r["task"]: r["cause"] or (r["validate_error"] or "")[:300]
                                      for r in runnable if not r["matches_task_verdict"]},
        "mismatches": [r["task"] for r in rows if r["matches_task_verdict"] is False],
        "validate_failures": {r["task"]: r["cause"] or (r["validate_error"] or "")[:300]
                              for r in rows if r["validate_ok"] is False},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs-dir", type=Path, default=Path("/tmp/rollbank-harbor-sweep"))
    ap.add_argument("-n", type=int, default=3, help="concurrent trials per Harbor job")
    ap.add_argument("--ek", action="append", default=[], help="--ek for the environment")
    ap.add_argument("--no-validate", action="store_true")
    ap.add_argument("--rescore", action="store_true", help="re-read --out and score its rows "
                    "again against expected.json (no runs)")
    args = ap.parse_args()
    expected_all = json.loads(EXPECTED.read_text())
    if args.rescore:
        doc = json.loads(args.out.read_text())
        doc["tasks"] = [score(r, expected_all) for r in doc["tasks"]]
        doc["summary"] = summarize(doc["tasks"])
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps(doc["summary"], indent=1))
        return 0
    rows: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    for folder in args.folders:
        folder = folder.resolve()
        # Harbor refuses a GPU task while constructing its environment, which ends the whole
        # job: such tasks are left out of the Harbor run (recorded) and only validated
        runnable = args.jobs_dir / "tasks" / folder.name
        shutil.rmtree(runnable, ignore_errors=True)
        runnable.mkdir(parents=True)
        for p in sorted(folder.iterdir()):
            if (p / "task.toml").is_file() and not gpus_of(p):
                (runnable / p.name).symlink_to(p)
        runs = {a: harbor_job(runnable, a, args.jobs_dir, args.n, args.ek) for a in ("oracle", "nop")}
        jobs += [{"folder": str(folder), "agent": a, **{k: v for k, v in r.items() if k != "trials"}}
                 for a, r in runs.items()]
        val = {} if args.no_validate else validate(folder, args.n)
        for task in sorted(p.name for p in folder.iterdir() if (p / "task.toml").is_file()):
            v = val.get(task)
            row: dict[str, Any] = {
                "task": task, "folder": folder.name, "folder_path": str(folder),
                "harbor": {a: runs[a]["trials"].get(task) for a in ("oracle", "nop")},
                "validate_ok": None if v is None else v["ok"],
                "validate_error": None if v is None else v.get("error"),
                "validate_approximations": None if v is None else v.get("approximations"),
            }
            rows.append(score(row, expected_all))
    summary = summarize(rows)
    doc = {"what": "real Harbor tasks through rollbank's Harbor environment provider "
                   "(harbor run, oracle and nop agents) and rollbank tasks validate",
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "host": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()},
           "harbor": subprocess.run([str(ROOT / ".venv-harbor" / "bin" / "python"), "-c",
                                     "import importlib.metadata as m; print(m.version('harbor'))"],
                                    capture_output=True, text=True, check=False).stdout.strip(),
           "summary": summary, "jobs": jobs, "tasks": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
