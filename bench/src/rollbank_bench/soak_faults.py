"""`rollbank bench soak --faults`: continuous faulted collection, resources sampled each minute.

Reuses the fault campaign's rig (:mod:`rollbank_bench.faults.rig`): accel-sim engine processes
behind the fault proxy, real bubblewrap sandboxes (warm) wrapped by the sandbox injector, the
scripted policy and the campaign's tasks with real verifiers, at the campaign's concurrency
(4 groups of 4 per batch, 8 groups in flight, 12 sandboxes, 2 engines). Collection runs in
rounds (:func:`~rollbank_bench.faults.rig.run_round`, a fresh run folder and seed each, the
folder deleted once judged) back to back until ``--minutes`` have passed (the round running
then finishes) and at least ``min_rounds`` (2) rounds are done. Every fault kind of the
campaign but the collector SIGKILL is injected (the soak is about the long-lived collector
process; its kills are the campaign's crash phase); every other round is an agent round (the
scripted agent program behind the gateway, the agent kinds: :mod:`.faults.agents`).

Meanwhile this process and its descendants are probed every ``--probe`` seconds
(:func:`rollbank_bench.soak.sample`: fds, threads, RSS, descendant processes, host mounts,
rollbank cgroups, live sandboxes) and each ``--interval`` closes one point of the curve
(:mod:`rollbank_bench.soak_curve`: floor, peak, last) with the faults injected so far per kind.
Each round's row also carries one reading taken when the round has drained (``at_end``:
nothing in flight; sandboxes still closing get up to :data:`SETTLE_S` to go, ``settle_s``,
and connections idle in the clients' pools their keep-alive expiry, :data:`POOL_LINGER_S`),
the sharpest view of a per-round leak; a sandbox still alive then is named in the row's
``lingering`` (its id and the faults injected into it, :meth:`Rig.lingering`).
The verdict on flatness is :func:`rollbank_bench.soak_curve.judge_curve`, on the drained readings
from the first round by which every kind of round has run once (:func:`drained_from`); after closing, the
campaign's leak snapshot must show nothing left over. Attribution per kind is the campaign's
(:func:`rollbank_bench.faults.report.summarize`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rollbank.inference.vllm_http import KEEPALIVE_EXPIRY_S
from rollbank_bench.faults.checks import Verdict
from rollbank_bench.faults.inject import FaultLog
from rollbank_bench.faults.kinds import FaultKind
from rollbank_bench.soak_curve import (
    DRAINED_ALLOWANCE,
    MINUTE_ALLOWANCE,
    RESOURCES,
    interval_record,
    judge_curve,
)
from rollbank_bench.soak_probe import describe_fds, mount_points, sample

#: Seconds a drained reading waits for sandboxes still closing when a round returns (a
#: teardown can still be running then: the smoke saw one sandbox left at one round's end).
SETTLE_S = 10.0
#: Seconds from a round's end by which the engine clients' pools have closed the connections
#: its last requests left idle (aiohttp sweeps idle connections every keep-alive expiry, so
#: one goes within two expiries of its last use), plus a margin: a drained reading taken
#: sooner counts a pooled connection (established, or closed by the peer) as a leak.
POOL_LINGER_S = 2 * KEEPALIVE_EXPIRY_S + 1.0


def campaign_args(args: argparse.Namespace) -> argparse.Namespace:
    """The fault campaign's defaults, with the soak's seed, rate and sizes."""
    from rollbank_bench import faults

    p = argparse.ArgumentParser()
    faults.add_arguments(p)
    c = p.parse_args([])
    c.seed, c.rate, c.quick, c.faults, c.collector_kills = args.seed, args.rate, False, 0, 0
    for name in ("groups", "group_size", "sandbox_slots", "pool_groups", "batches_per_round",
                 "clean_tasks"):
        if getattr(args, name, None) is not None:
            setattr(c, name, getattr(args, name))
    return c


class Curve:
    """Probes grouped into intervals, with the faults injected so far (see module doc)."""

    def __init__(self, interval_s: float, log: FaultLog) -> None:
        self.interval_s, self.log = interval_s, log
        self.intervals: list[dict[str, Any]] = []
        self._probes: list[dict[str, float]] = []
        self.judged: Counter[str] = Counter()
        self.correct: Counter[str] = Counter()
        self.rounds = 0

    def add_round(self, verdicts: list[Verdict]) -> None:
        self.rounds += 1
        for v in verdicts:
            self.judged[v.kind.value] += 1
            self.correct[v.kind.value] += v.observed and v.correct

    def probe(self, reading: dict[str, float], elapsed_s: float) -> None:
        self._probes.append(reading)
        if elapsed_s >= (len(self.intervals) + 1) * self.interval_s:
            rec = interval_record(len(self.intervals), self._probes)
            rec["elapsed_s"] = round(elapsed_s, 1)
            rec["injected_outside"] = dict(Counter(i.kind.value for i in self.log.items))
            rec["rounds_done"] = self.rounds
            rec["loadavg_1m"] = round(os.getloadavg()[0], 2)
            rec["faults_judged"] = dict(self.judged)
            rec["attributed_correctly"] = dict(self.correct)
            self.intervals.append(rec)
            self._probes = []


async def _sample_forever(curve: Curve, live: Any, probe_s: float, t0: float) -> None:
    while True:
        n = live()  # on the loop: the backend's table is not read from a thread
        reading = await asyncio.to_thread(sample, functools.partial(int, n))
        curve.probe(reading, time.monotonic() - t0)
        await asyncio.sleep(probe_s)


def drained_from(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rounds whose drained readings are judged: from the first round by which every kind
    of round (harness, agent) has run once. A kind's first round loads its code (the agent
    stack, the gateway: ~40 MiB of RSS in one step, once), which is warm-up, not a leak."""
    firsts: dict[bool, int] = {}
    for i, r in enumerate(rounds):
        firsts.setdefault(bool(r.get("agents")), i)
    start = max(firsts.values(), default=0)
    return rounds[start:] if len(rounds) - start >= 2 else rounds


async def _settle(live: Any, limit_s: float = SETTLE_S) -> float:
    """Wait (up to ``limit_s``) for sandboxes still closing when a round returns to go; the
    seconds waited. A sandbox that never goes is what the drained reading then shows."""
    t = time.monotonic()
    for _ in range(int(limit_s / 0.2)):  # a poll: the backend offers no "all closed" event
        if not live():
            break
        await asyncio.sleep(0.2)
    return round(time.monotonic() - t, 2)


async def soak_faults(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from rollbank_bench.faults.campaign import engine_note
    from rollbank_bench.faults.leaks import leaked, snapshot
    from rollbank_bench.faults.report import summarize
    from rollbank_bench.faults.rig import agent_round, open_rig, run_round

    cargs = campaign_args(args)
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    before = await asyncio.to_thread(snapshot)
    baseline = await asyncio.to_thread(sample, lambda: 0)
    base_mounts = await asyncio.to_thread(mount_points)
    verdicts: list[Verdict] = []
    rounds: list[dict[str, Any]] = []
    errors: list[str] = []
    clean: dict[str, Any] = {"attempts": 0, "trainable": 0, "collateral_inference_error": 0,
                             "unexplained": []}
    t0 = time.monotonic()
    load_start = os.getloadavg()
    async with open_rig(cargs, out) as rig:
        curve = Curve(args.interval, rig.log)
        t_collect = time.monotonic()
        sampler = asyncio.create_task(_sample_forever(curve, rig.live_sandboxes, args.probe,
                                                      t_collect))
        try:
            r = 0
            while (time.monotonic() - t_collect < args.minutes * 60
                   or r < getattr(args, "min_rounds", 2)):
                res = await run_round(rig, cargs, out, r, agents=agent_round(rig, r))
                verdicts += res.verdicts
                curve.add_round(res.verdicts)
                errors += [f"round {r}: {e}" for e in res.errors]
                for k in ("attempts", "trainable", "collateral_inference_error"):
                    clean[k] += res.clean[k]
                clean["unexplained"] += res.clean["unexplained"][:20]
                res.row["settle_s"] = await _settle(rig.live_sandboxes)
                await asyncio.sleep(max(0.0, POOL_LINGER_S - res.row["settle_s"]))
                n = rig.live_sandboxes()
                if n:  # who lingers (ids, faults injected into them); see Rig.lingering
                    res.row["lingering"] = rig.lingering()
                res.row["at_end"] = await asyncio.to_thread(sample, functools.partial(int, n))
                res.row["at_end_fds"] = await asyncio.to_thread(describe_fds)
                # connections the fault proxy still serves (none when drained): a client that
                # opened one and went away without a request shows here
                res.row["proxy_connections"] = len(rig.proxy.conns)
                now = await asyncio.to_thread(mount_points)
                res.row["mounts_vs_baseline"] = {  # the host's table: another job's show here
                    "added": sorted(set(now) - set(base_mounts))[:10],
                    "removed": sorted(set(base_mounts) - set(now))[:10]}
                res.row["end_interval"] = round((time.monotonic() - t_collect) / args.interval, 3)
                rounds.append(res.row)
                if not args.keep_rounds:  # disk stays flat too; the verdicts are taken
                    await asyncio.to_thread(shutil.rmtree, out / f"round-{r:03d}", True)
                r += 1
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        collect_s = time.monotonic() - t_collect
        missed = len(rig.source.missed)
        injector_errors, proxy = rig.source.errors, {"collateral": len(rig.proxy.collateral),
                                                     "windows": rig.proxy.windows[:50]}
    await asyncio.to_thread(gc.collect)
    await asyncio.sleep(0.5)  # let killed children be reaped
    after = await asyncio.to_thread(sample, lambda: 0)
    leaks = leaked(before, await asyncio.to_thread(snapshot))
    phase = {"verdicts": verdicts, "errors": errors, "rounds": rounds, "clean": clean,
             "injector_errors": injector_errors, "injector_missed": missed, "proxy": proxy,
             "engine": engine_note(cargs),
             "seconds": round(time.monotonic() - t0, 1), "kill_phase_s": 0.0}
    faults = summarize(phase, leaks, cargs)
    faults["by_kind"].pop(FaultKind.COLLECTOR_SIGKILL.value, None)  # not in the soak
    faults["checks"]["every_kind_injected"] = all(k["injected"] > 0 for k in faults["by_kind"].values())
    checks = faults.pop("checks")
    verdict = judge_curve(curve.intervals, [(r["end_interval"], r["at_end"]) for r in drained_from(rounds)],
                          args.warmup_minutes)
    checks["flat"] = verdict["flat"]
    after_close = {k: round(after[k] - baseline[k], 1) for k in ("fds", "processes", "mounts", "cgroups")}
    checks["nothing_left_after_close"] = not any(v > 0 for v in after_close.values())
    for k in ("benchmark", "quick", "ok", "size", "seconds", "engine", "leaks", "rounds", "proxy"):
        faults.pop(k, None)
    return {
        "bench": "soak", "faults": True,
        "wall_clock": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "minutes_requested": args.minutes, "collect_s": round(collect_s, 1),
        "interval_s": args.interval, "probe_s": args.probe, "warmup_intervals": args.warmup_minutes,
        "size": {"groups": cargs.groups, "group_size": cargs.group_size,
                 "pool_groups": cargs.pool_groups, "sandbox_slots": cargs.sandbox_slots,
                 "engines": cargs.engines, "rate": cargs.rate, "seed": cargs.seed},
        "engine": engine_note(cargs),
        "host": {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in load_start],
                 "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                 "note": "timings (round seconds) depend on the host's load: see loadavg_1m per "
                 "interval; the resource counts do not"},
        "allowance": {"minute_curve": MINUTE_ALLOWANCE, "drained": DRAINED_ALLOWANCE},
        "flatness": verdict, "curve": curve.intervals,
        "baseline": baseline, "after_close": after, "after_close_delta": after_close,
        "leaks": leaks, "attribution": faults, "rounds": rounds, "proxy": proxy,
        "checks": checks, "ok": all(v for k, v in checks.items() if k != "attribution_correct"),
        "ok_note": "attribution_correct is reported, not required: the campaign's documented "
        "known limits (faults.kinds.KNOWN_LIMITS) count as wrong there; no_new_misattribution "
        "is required",
    }


def plot(report: dict[str, Any], path: Path) -> None:
    """The curve as a PNG: one panel per resource, floor (line) and peak (dots) per interval,
    the judged span shaded (matplotlib, the [report] extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve, rounds, iv = report["curve"], report["rounds"], report["interval_s"] / 60
    fl = report["flatness"]
    fig, axes = plt.subplots(len(RESOURCES), 1, figsize=(8, 1.6 * len(RESOURCES)), sharex=True)
    xs = [(c["interval"] + 1) * iv for c in curve]
    for ax, k in zip(axes, RESOURCES, strict=True):
        ax.plot(xs, [c["floor"][k] for c in curve], "-o", ms=3, label="minute floor")
        ax.plot(xs, [c["peak"][k] for c in curve], ".", alpha=0.5, label="minute peak")
        ax.plot([r["end_interval"] * iv for r in rounds], [r["at_end"][k] for r in rounds], "x",
                ms=4, label="round end (drained)")
        ax.axvspan(0, report["warmup_intervals"] * iv, color="0.9", zorder=0)
        d = fl["drained"]["per_resource"].get(k, {})
        m = fl["minute_curve"]["per_resource"].get(k)
        title = f"{k}: drained trend {d.get('trend')} (allow {d.get('allowance')})"
        if m is not None:
            title += f"; minute-floor trend {m['trend']} (allow {m['allowance']})"
        ax.set_ylabel(k)
        ax.set_title(title + (" flat" if d.get("flat") and (m is None or m["flat"]) else " NOT flat"),
                     fontsize=8)
    axes[0].legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("minutes of collection (grey: warm-up, not judged)")
    fig.suptitle(f"rollbank bench soak --faults ({report['wall_clock']}): "
                 f"{report['attribution']['faults_injected']} faults", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    import tempfile

    if args.out:
        report = asyncio.run(soak_faults(args, Path(args.out)))
    else:
        with tempfile.TemporaryDirectory(prefix="rollbank-soak-faults-") as tmp:
            report = asyncio.run(soak_faults(args, Path(tmp)))
    if args.plot:
        plot(report, Path(args.plot))
    json.dump(report, sys.stdout, indent=2, default=str)
    print()
    return 0 if report["ok"] else 1
