"""The collector itself SIGKILLed mid-batch, then ``rollbank collect --resume``.

Each kill: a real ``rollbank collect`` process (real sandboxes and verifiers, the campaign's
accel-sim engines as external servers, a trace workload) is SIGKILLed at a seeded moment
after its first launch; ``rollbank collect --resume RUN_DIR`` then finishes the run. Checked:
batch indices are exactly ``0..num_batches-1`` (none rewritten or duplicated), no group is
in two batches, every attempt launched by the crashed process is accounted exactly once in
the resume record (in a written batch, settled but lost, or in flight -> ``infra_failure``
``host_error``), the resumed run's ledger is exact, and the killed process's cgroups and
sandbox folders were reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

import rollbank
import rollbank_bench
from rollbank.batching.loader import read_batch_dir
from rollbank.sandbox.local.cgroups import owner_tag
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank_bench.faults.checks import Verdict
from rollbank_bench.faults.kinds import FaultKind
from rollbank_bench.faults.leaks import sandbox_cgroups

# this checkout's rollbank_bench and rollbank win in the child
SRC = os.pathsep.join(dict.fromkeys(str(Path(m.__file__ or "").resolve().parents[1])
                                    for m in (rollbank_bench, rollbank)))
BATCHES = 3


def collect_argv(run_dir: Path, urls: list[str], tasks: Path, seed: int) -> list[str]:
    sets = {"tasks": [str(tasks)], "exclude_costs": [], "include": [], "output": str(run_dir),
            "workload.kind": "trace", "workload.turns_median": 2, "workload.max_turns": 3,
            "workload.tool_latency_median_s": 0.5, "workload.tool_latency_max_s": 1.5,
            "runner.episode_budget_s": None, "runner.max_model_len": 2048,
            "scheduler.groups_per_batch": 2, "scheduler.pool_groups": 3,
            "scheduler.num_batches": BATCHES, "scheduler.bank.group_size": 2,
            "scheduler.seed": seed, "task_order_seed": seed, "scheduler.sandbox_slots": 6,
            "inference.kind": "external", "inference.urls": urls, "inference.tokenizer": "tiny",
            "inference.calibrate": False, "metrics.live": "off", "metrics.report": False}
    argv = [sys.executable, "-m", "rollbank.cli.main", "collect"]
    for k, v in sets.items():
        argv += ["--set", f"{k}={json.dumps(v)}"]
    return argv


async def _spawn(argv: list[str], log: Path) -> asyncio.subprocess.Process:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH", "")) if p)
    with log.open("ab") as f:
        return await asyncio.create_subprocess_exec(*argv, stdout=f, stderr=f, env=env)


def _launched(run_dir: Path) -> bool:
    with contextlib.suppress(OSError):
        return b'"launched"' in (run_dir / "events.jsonl").read_bytes()
    return False


async def one_kill(k: int, root: Path, urls: list[str], tasks: Path, seed: int,
                   timeout_s: float = 300.0) -> tuple[Verdict, list[str]]:
    """One SIGKILL + resume; the fault's verdict and what the checks found wrong."""
    rng = random.Random(f"rollbank-faults-crash:{seed}:{k}")
    run_dir = root / f"run-{k:03d}"
    proc = await _spawn(collect_argv(run_dir, urls, tasks, seed + k), root / f"run-{k:03d}.log")
    tag = owner_tag(proc.pid)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if _launched(run_dir) or proc.returncode is not None:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(rng.uniform(0.5, 8.0))
    killed = proc.returncode is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()
    detail: dict[str, Any] = {"run": run_dir.name, "killed": killed}
    errs: list[str] = []
    if killed:
        resumed = await _spawn([sys.executable, "-m", "rollbank.cli.main", "collect", "--resume",
                                str(run_dir)], root / f"run-{k:03d}.resume.log")
        try:
            rc = await asyncio.wait_for(resumed.wait(), timeout_s)
        except TimeoutError:
            resumed.kill()
            rc = await resumed.wait()
        detail["resume_exit"] = rc
        if rc != 0:
            errs.append(f"{run_dir.name}: resume exited {rc}")
    errs += await asyncio.to_thread(check_run, run_dir, tag if killed else None, detail)
    outcome = "infra_failure" if killed and not errs else ("wrong" if killed else None)
    return Verdict(FaultKind.COLLECTOR_SIGKILL, None, outcome, "host_error" if outcome else None,
                   detail), errs


def check_run(run_dir: Path, dead_tag: str | None, detail: dict[str, Any]) -> list[str]:
    errs = []
    batches = sorted(p.name for p in (run_dir / "batches").iterdir() if p.name.startswith("batch-")) \
        if (run_dir / "batches").is_dir() else []
    want = [f"batch-{i:06d}" for i in range(BATCHES)]
    if batches != want:
        errs.append(f"{run_dir.name}: batches {batches} != {want}")
    groups: list[str] = []
    for b in batches:
        try:  # checks the manifest, checksum and schema: no half-written batch
            table = read_batch_dir(run_dir / "batches" / b)
        except Exception as exc:
            errs.append(f"{run_dir.name}/{b}: unreadable: {exc}")
            continue
        groups += sorted({str(g) for g in table.column("group_id").to_pylist()})
    if len(groups) != len(set(groups)):
        errs.append(f"{run_dir.name}: a group in two batches")
    if dead_tag is not None:
        try:
            rec = json.loads((run_dir / "resume.json").read_text())[-1]
        except (OSError, ValueError, IndexError) as exc:
            return [*errs, f"{run_dir.name}: no resume record ({exc})"]
        c = rec["crashed_run"]
        accounted = c["in_written_batches"] + len(c["settled_not_batched"]) + len(c["in_flight"])
        detail.update(launched=c["launched"], in_flight=len(c["in_flight"]),
                      batches_before_crash=len(rec["batches_written"]))
        if accounted != c["launched"]:
            errs.append(f"{run_dir.name}: crashed run launched {c['launched']}, accounted {accounted}")
        if any(a.get("outcome") != "infra_failure" for a in c["in_flight"]):
            errs.append(f"{run_dir.name}: an in-flight attempt not infra_failure")
        if sandbox_cgroups(dead_tag):
            errs.append(f"{run_dir.name}: the killed collector's cgroups were not reaped")
        if (LocalSandboxConfig().run_dir / dead_tag).exists():
            errs.append(f"{run_dir.name}: the killed collector's sandbox folder was not reaped")
    with contextlib.suppress(OSError, ValueError):
        ledger = json.loads((run_dir / "summary.json").read_text()).get("ledger", {})
        settled = sum(int(ledger.get(s, 0)) for s in ("consumed", "retried", "waste"))
        if int(ledger.get("launched", -1)) != settled:
            errs.append(f"{run_dir.name}: resumed ledger launched {ledger.get('launched')} != {settled}")
    return errs


async def run_kills(n: int, root: Path, urls: list[str], tasks: Path, seed: int) -> dict[str, Any]:
    await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
    verdicts: list[Verdict] = []
    errors: list[str] = []
    for k in range(n):
        v, errs = await one_kill(k, root, urls, tasks, seed)
        verdicts.append(v)
        errors += errs
    return {"verdicts": verdicts, "errors": errors}
