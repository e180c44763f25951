"""`rollbank tasks list|build|validate PATH...` — thin front end over rollbank.tasks.

PATH is a task folder, a folder of task folders, or a built-in suite name (``terminal-lite``).
``validate`` reports every task — a task that fails to load is reported (FAIL, with the file
and field at fault) and the others are still validated — and exits 0 only if every task loaded,
its oracle scored 1 and its no-op agent did not (1 otherwise); ``--json`` prints one JSON
object per task (one per line) as each finishes. Heavy imports are
inside the handlers so ``rollbank --help`` stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("tasks", help="list, build and validate tasks")
    tsub = p.add_subparsers(dest="tasks_command", required=True)

    ls = tsub.add_parser("list", help="list tasks (id, format, difficulty, category, cost, hash)")
    ls.add_argument("paths", nargs="+", metavar="PATH")
    ls.add_argument("--json", action="store_true", help="one JSON object per task")
    ls.set_defaults(func=_list)

    b = tsub.add_parser("build", help="build (or find cached) task environments")
    b.add_argument("paths", nargs="+", metavar="PATH")
    b.add_argument("--json", action="store_true", help="one JSON object per task")
    b.set_defaults(func=_build)

    v = tsub.add_parser("validate", help="build each task, check oracle = 1 and no-op != 1")
    v.add_argument("paths", nargs="+", metavar="PATH")
    v.add_argument("--json", action="store_true", help="one JSON object per task, as each finishes")
    v.add_argument("--jobs", type=int, default=1,
                   help="tasks validated (and probed) concurrently (default 1)")
    v.add_argument("--probe", action="store_true",
                   help="also probe the verifier for loopholes: the oracle passes and cheats (empty or "
                   "placeholder outputs, fake tests, a written reward, background writers/killers, a "
                   "self-replacing tamperer, a trojan test runner, a pytest config hijack) must "
                   "not (episodes/probes.py)")
    v.set_defaults(func=_validate)

    h = tsub.add_parser("health", help="per-task solve rates across batches and evaluations")
    h.add_argument("paths", nargs="+", metavar="PATH",
                   help="collection runs (or batches/ folders) and evaluation folders (eval.json)")
    h.add_argument("--min-attempts", type=int, default=4,
                   help="attempts a task needs before it is flagged saturated / never solved")
    h.add_argument("--out", help="write the health file (for exclude_saturated_from)")
    h.add_argument("--json", action="store_true", help="print the health document as JSON")
    h.set_defaults(func=_health)


def _load(paths: list[str]) -> Any:
    """The tasks at ``paths``; a bad task folder raises its :class:`InputError`, which
    ``rollbank.cli.main`` reports and ends with exit 3 (bad input)."""
    from rollbank.tasks.loader import load_tasks

    return load_tasks(paths)


def _list(args: argparse.Namespace) -> int:
    tasks = _load(args.paths)
    rows = [{"id": t.task_id, "format": t.format.value, "difficulty": t.difficulty or "-",
             "category": t.category or "-", "cost": t.cost or "-", "hash": t.content_hash[:12],
             "path": str(t.path)} for t in tasks]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    cols = ["id", "format", "difficulty", "category", "cost", "hash"]
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  ".join(c.upper().ljust(width[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r[c]).ljust(width[c]) for c in cols))
    for t in tasks:
        for w in t.warnings:
            print(f"warning: {t.task_id}: {w}", file=sys.stderr)
    return 0


def _build(args: argparse.Namespace) -> int:
    from rollbank.errors import InputError
    from rollbank.tasks.builder import EnvironmentBuilder

    tasks = _load(args.paths)
    builder = EnvironmentBuilder()
    code = 0
    for t in tasks:
        try:
            built = builder.build(t)
        except InputError as exc:
            code = 1
            out: dict[str, Any] = {"task_id": t.task_id, "ok": False, "error": str(exc)}
        else:
            out = {"task_id": t.task_id, "ok": True, "build_s": round(built.build_s, 3),
                   "cached": built.cached, "steps_built": built.steps_built,
                   "layers": [str(p) for p in built.layers], "layer_hashes": list(built.layer_hashes),
                   "workdir": built.workdir, "approximations": list(built.approximations),
                   "pinned_digests": list(built.pinned_digests),
                   "notes": list(built.notes)}
        if args.json:
            print(json.dumps(out), flush=True)
        elif out["ok"]:
            print(f"{t.task_id}: built in {out['build_s']:.2f}s ({'cached' if built.cached else f'{built.steps_built} steps'}), "
                  f"{len(built.layers)} layers" + "".join(f"\n  approx: {a}" for a in built.approximations), flush=True)
        else:
            print(f"{t.task_id}: FAILED {out['error']}", flush=True)
    return code


def _validate(args: argparse.Namespace) -> int:
    import asyncio

    from rollbank.episodes.validate import Validation
    from rollbank.tasks.loader import LoadFailure, load_each

    entries = load_each(args.paths)
    failures = [e for e in entries if isinstance(e, LoadFailure)]
    tasks = [e for e in entries if not isinstance(e, LoadFailure)]
    for f in failures:
        rec = Validation(f.task_id, str(f.path), "-", "", error=f"load failed: {f.error}")
        _show(rec, args)
    if not tasks:
        if not args.json:
            print(f"0/{len(failures)} tasks passed; failed: {', '.join(f.task_id for f in failures)}")
        return 1
    return asyncio.run(_validate_async(tasks, args, [f.task_id for f in failures]))


def _show(rec: Any, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(rec.to_dict()), flush=True)
        return
    t = rec.timings
    mark = "PASS" if rec.ok else "FAIL"
    if rec.format == "-":  # did not load: nothing ran
        print(f"{mark}  {rec.task_id:32s} {rec.error}", flush=True)
        return
    print(f"{mark}  {rec.task_id:32s} oracle={_r(rec.oracle_reward)} noop={_r(rec.noop_reward)} "
          f"build={t.get('build_s', 0):.1f}s oracle={t.get('oracle_s', 0):.1f}s "
          f"noop={t.get('noop_s', 0):.1f}s" + (f"\n      {rec.error}" if rec.error else ""),
          flush=True)


async def _validate_async(tasks: list[Any], args: argparse.Namespace, load_failed: list[str]) -> int:
    from rollbank.episodes.validate import Validation, validate_tasks
    from rollbank.errors import IsolationUnavailableError
    from rollbank.sandbox.local.backend import LocalBackend
    from rollbank.tasks.builder import EnvironmentBuilder

    def show(rec: Validation) -> None:
        _show(rec, args)

    probes: list[Any] = []
    try:
        async with LocalBackend() as backend:
            results = await validate_tasks(tasks, backend, EnvironmentBuilder(),
                                           jobs=args.jobs, on_result=show)
            if args.probe:
                probes = await _probe(tasks, backend, args)
    except IsolationUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = load_failed + [r.task_id for r in results if not r.ok]
    failed += [p.task_id for p in probes if not p.ok and p.task_id not in failed]
    total = len(results) + len(load_failed)
    if not args.json:
        print(f"{total - len(failed)}/{total} tasks passed"
              + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 0 if not failed else 1


async def _probe(tasks: list[Any], backend: Any, args: argparse.Namespace) -> list[Any]:
    """Probe every task, ``--jobs`` at a time; each report is shown as it finishes."""
    import asyncio

    from rollbank.episodes.probes import probe_built
    from rollbank.tasks.builder import EnvironmentBuilder

    builder = EnvironmentBuilder()
    sem = asyncio.Semaphore(max(1, args.jobs))
    reports: dict[int, Any] = {}

    async def one(i: int, task: Any) -> None:
        async with sem:
            reports[i] = rep = await probe_built(task, backend, builder)
        _show_probe(rep, args)

    async with asyncio.TaskGroup() as tg:
        for i, task in enumerate(tasks):
            tg.create_task(one(i, task))
    return [reports[i] for i in range(len(tasks))]


def _show_probe(rep: Any, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps({"probe": rep.to_dict()}), flush=True)
        return
    if rep.skipped:
        print(f"PROBE {rep.task_id:32s} skipped: {rep.skipped}", flush=True)
        return
    oracle = rep.oracle.status if rep.oracle else "-"
    cheats = " ".join(f"{c.name}={(c.error and 'error') or c.status}" for c in rep.cheats)
    mark = "PASS" if rep.ok else "FAIL"
    print(f"PROBE {mark} {rep.task_id:27s} oracle={oracle} outputs={len(rep.outputs)} {cheats}"
          + (f"\n      loopholes: {', '.join(rep.loopholes)}" if rep.loopholes else ""),
          flush=True)


def _health(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rollbank.evaluation.health import health, load_sources

    doc = health(load_sources([Path(p) for p in args.paths]), min_attempts=args.min_attempts)
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    for task, t in doc["tasks"].items():
        rate = "-" if t["solve_rate"] is None else f"{t['solve_rate']:.2f}"
        print(f"{task:32s} {t['successes']:4d}/{t['attempts']:<4d} {rate:>5s} {t['flag'] or ''}")
    print(f"saturated: {len(doc['saturated'])}, never solved: {len(doc['never_solved'])}, "
          f"zero-variance groups: {doc['zero_variance_groups']}/{doc['groups']}")
    return 0


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"
