"""Sandbox start, fork, exec and density benchmark (JSON).

Owns ``rollbank bench sandbox``. What each number means (all on this host, real sandboxes
from :class:`~rollbank.sandbox.local.LocalBackend` on the Debian base of
:func:`rollbank.tasks.bases.ensure_base`; the base itself is cached and not part of "cold"):

* ``cold_start_ms``: environment built from scratch, then a sandbox ready: a fresh Harbor
  task whose Dockerfile has one unique ``RUN`` step (so the layer cache misses) is built by
  :class:`~rollbank.tasks.builder.EnvironmentBuilder` into an empty layer cache, a sandbox is
  started on ``base + built layers`` and its first command (``true``) returns.
* ``warm_start_ms``: a sandbox started from a snapshot (base + one frozen writable layer made
  by ``Sandbox.snapshot()``) until ``start`` returns, ready to exec; ``warm_ready_ms`` adds
  the first ``true``; ``warm_cycle_cpu_ms`` is the CPU (this process + reaped children, user
  + system) of one start + first exec + close: unlike wall times, it does not depend on how
  busy the shared host is (``fork8_cycle_cpu_ms``: the same for a fork of 8 and 8 closes).
* ``fork8_ms``: ``backend.fork(snapshot, 8)`` until all 8 siblings are ready;
  ``pool_fork8_ms``: the same group handed out by a :class:`~rollbank.sandbox.pool.WarmPool`
  holding 8 pre-started siblings (refilled between samples, outside the timing).
* ``exec``: ``true`` run in a sandbox vs ``/bin/true`` run bare on the host through the same
  process runner (Popen + pidfd); ``overhead_ms`` is the difference of the medians.
* ``concurrent``: N sandboxes started at once; memory per idle sandbox = PSS of its host
  processes (outer bwrap, bwrap pid 1, ``sleep`` anchor) from ``smaps_rollup`` plus the
  kernel memory charged to its cgroup (``memory.usage_in_bytes``: tmpfs layer, page tables,
  kernel objects). RSS is reported too (it counts shared libraries once per process).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rollbank_bench.timing import summary

TARGETS = {"warm_start_p50_ms": 20.0, "fork8_p50_ms": 50.0, "exec_overhead_ms": 10.0,
           "host_mb_per_idle_sandbox": 8.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--samples", type=int, default=40, help="warm starts / execs measured")
    parser.add_argument("--fork-samples", type=int, default=12, help="fork-of-8 repetitions")
    parser.add_argument("--cold-samples", type=int, default=3, help="cold builds measured")
    parser.add_argument("--concurrent", type=int, default=64, help="sandboxes started at once")
    parser.add_argument("--run-dir", type=Path, default=None, help="backend run directory")
    parser.add_argument("--userns", choices=("auto", "mapped", "off"), default="auto",
                        help="the backend's user-namespace id mapping (LocalSandboxConfig.userns)")
    parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help="compare start/fork/exec through the Ray backend with local, side "
                        "by side (ADDRESS: a running cluster; alone: one is started here for "
                        "the run); see rollbank_bench.sandbox_ray")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json

    if args.ray is not None:
        from rollbank_bench.sandbox_ray import run_ray

        result = run_ray(args)
    else:
        result = asyncio.run(_bench(args))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0 if "error" not in result else 1


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    import os
    import platform
    import tempfile
    import time

    from rollbank.sandbox.local.backend import LocalBackend
    from rollbank.sandbox.local.config import LocalSandboxConfig
    from rollbank.sandbox.local.proc import run_process
    from rollbank.sandbox.local.sandbox import LocalSandbox
    from rollbank.sandbox.protocol import SandboxSpec
    from rollbank.tasks.bases import ensure_base

    base = ensure_base("ubuntu:24.04").path
    out: dict[str, Any] = {
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                 "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
        "definitions": "see the docstring of rollbank_bench.sandbox",
    }
    with tempfile.TemporaryDirectory(prefix="rb-bench-") as tmp:
        run_dir = args.run_dir or Path(tmp) / "run"
        cfg = LocalSandboxConfig(run_dir=run_dir, max_concurrent_starts=max(16, args.concurrent),
                                 userns=getattr(args, "userns", "auto"))
        async with LocalBackend(cfg) as backend:
            spec = SandboxSpec(layers=(base,))
            # ---------------------------------------------------------- snapshot to fork from
            seed = await backend.start(spec)
            await seed.exec("mkdir -p /app && echo prepared > /app/state.txt")
            snap = await seed.snapshot()
            await seed.close()
            out["userns"] = backend.userns_reason
            # ---------------------------------------------------------- warm start
            starts, readies, closes = [], [], []
            cpu0 = _cpu_s()
            for _ in range(args.samples):
                t0 = time.perf_counter()
                (sb,) = await backend.fork(snap, 1)
                t1 = time.perf_counter()
                r = await sb.exec("true")
                t2 = time.perf_counter()
                assert r.ok, r
                await sb.close()
                closes.append(time.perf_counter() - t2)
                starts.append(t1 - t0)
                readies.append(t2 - t0)
            out["warm_start_ms"] = summary(starts)
            out["warm_cycle_cpu_ms"] = round((_cpu_s() - cpu0) / args.samples * 1000, 2)
            out["warm_ready_ms"] = summary(readies)
            out["close_ms"] = summary(closes)
            # ---------------------------------------------------------- fork of 8
            forks = []
            cpu0 = _cpu_s()
            for _ in range(args.fork_samples):
                t0 = time.perf_counter()
                group = await backend.fork(snap, 8)
                forks.append(time.perf_counter() - t0)
                for s in group:
                    await s.close()
            out["fork8_ms"] = summary(forks)
            out["fork8_cycle_cpu_ms"] = round((_cpu_s() - cpu0) / args.fork_samples * 1000, 2)
            out["pool_fork8_ms"] = await _pool_fork8(backend, spec, args.fork_samples)
            # ---------------------------------------------------------- exec overhead
            (sb,) = await backend.fork(snap, 1)
            assert isinstance(sb, LocalSandbox)
            in_sb, bare = [], []
            cpu_sb = 0.0
            for _ in range(args.samples):
                c0 = _cpu_s()
                t0 = time.perf_counter()
                r = await sb.exec("true")
                in_sb.append(time.perf_counter() - t0)
                cpu_sb += _cpu_s() - c0
                assert r.ok
                t0 = time.perf_counter()
                res = await run_process(["/bin/true"], env={"PATH": "/usr/bin:/bin"}, stdin=None,
                                        limit=1024, deadline_s=10, kill=lambda p: p.kill())
                bare.append(time.perf_counter() - t0)
                assert res.returncode == 0
            e_sb, e_bare = summary(in_sb), summary(bare)
            out["exec"] = {"sandbox_ms": e_sb, "bare_host_ms": e_bare,
                           "overhead_ms": round(e_sb["p50"] - e_bare["p50"], 2),
                           "sandbox_cpu_ms_per_exec": round(cpu_sb / args.samples * 1000, 2),
                           "command": "true (in the sandbox: /bin/sh -c true through rb-helper)"}
            await sb.close()
            # ---------------------------------------------------------- concurrent density
            out["concurrent"] = await _concurrent(backend, snap, args.concurrent)
        # -------------------------------------------------------------- cold
        out["cold_start_ms"] = await _cold(args.cold_samples, Path(tmp), base)
    out["targets"] = _verdict(out)
    out["host"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


async def _pool_fork8(backend: Any, spec: Any, samples: int) -> dict[str, Any]:
    """WarmPool with 8 pre-started siblings per key: what an episode runner waits for."""
    import asyncio
    import time

    from rollbank.sandbox.config import WarmPoolConfig
    from rollbank.sandbox.pool import WarmPool

    times = []
    async with WarmPool(backend, WarmPoolConfig(prestart=8)) as pool:
        for _ in range(samples):
            await pool.prewarm("bench", spec)  # refill outside the timed region
            t0 = time.perf_counter()
            group = await pool.fork("bench", spec, 8)
            times.append(time.perf_counter() - t0)
            await asyncio.gather(*(sb.close() for sb in group))
    return {**summary(times), "what": "WarmPool(prestart=8).fork(key, spec, 8) with the "
            "stock refilled between samples (not a substitute for fork8_ms)"}


async def _concurrent(backend: Any, snap: Any, n: int) -> dict[str, Any]:
    import asyncio
    import time

    mem_before = _meminfo_available_kb()
    t0 = time.perf_counter()
    group = await asyncio.gather(*(backend.fork(snap, 1) for _ in range(n)))
    total = time.perf_counter() - t0
    sandboxes = [g[0] for g in group]
    await asyncio.sleep(0.5)  # let every sandbox settle to idle
    pss, rss, cg = [], [], []
    for sb in sandboxes:
        procs = [sb.init_pid, *_children(sb.init_pid), sb.anchor_pid]
        p_kb = r_kb = 0
        for pid in set(procs):
            sm = _smaps_rollup(pid)
            p_kb += sm.get("Pss", 0)
            r_kb += sm.get("Rss", 0)
        pss.append(p_kb)
        rss.append(r_kb)
        cg.append(sb.cgroup.memory_current() / 1024)
    mem_after = _meminfo_available_kb()
    ok = sum(1 for r in await asyncio.gather(*(sb.exec("true") for sb in sandboxes)) if r.ok)
    for sb in sandboxes:
        await sb.close()
    per_mb = (_mean(pss) + _mean(cg)) / 1024
    return {
        "n": n, "total_start_s": round(total, 3), "all_exec_ok": ok == n,
        "per_sandbox_host_pss_kb": round(_mean(pss)), "per_sandbox_host_rss_kb": round(_mean(rss)),
        "per_sandbox_cgroup_kb": round(_mean(cg)),
        "host_mb_per_idle_sandbox": round(per_mb, 2),
        "memavailable_drop_mb_per_sandbox": round((mem_before - mem_after) / 1024 / n, 2),
        "note": "host_mb = PSS of host processes + cgroup-charged kernel memory; "
                "MemAvailable drop is noisy (other work shares this host)",
    }


async def _cold(samples: int, tmp: Path, base: Path) -> dict[str, Any]:
    import asyncio
    import time
    import uuid

    from rollbank.sandbox.local.backend import LocalBackend
    from rollbank.sandbox.local.config import LocalSandboxConfig
    from rollbank.sandbox.protocol import SandboxSpec
    from rollbank.tasks.builder import EnvironmentBuilder
    from rollbank.tasks.config import BuilderConfig
    from rollbank.tasks.loader import load_task

    totals, builds, starts = [], [], []
    async with LocalBackend(LocalSandboxConfig(run_dir=tmp / "cold-run")) as backend:
        for i in range(samples):
            task_dir = tmp / f"cold-task-{i}"
            (task_dir / "environment").mkdir(parents=True)
            (task_dir / "tests").mkdir()
            (task_dir / "solution").mkdir()
            (task_dir / "instruction.md").write_text("Benchmark task.\n")
            (task_dir / "task.toml").write_text('version = "1.0"\n[environment]\ncpus = 1\n')
            (task_dir / "environment" / "Dockerfile").write_text(
                "FROM ubuntu:24.04\nWORKDIR /app\n"
                f"RUN echo {uuid.uuid4().hex} > /app/marker && seq 1 2000 > /app/data.txt\n"
            )
            (task_dir / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
            (task_dir / "solution" / "solve.sh").write_text("#!/bin/sh\ntrue\n")
            try:
                t0 = time.perf_counter()
                task = load_task(task_dir)
                builder = EnvironmentBuilder(BuilderConfig(network=False, cache_root=str(tmp / f"layers-{i}")))
                env = await asyncio.to_thread(builder.build, task)
                t1 = time.perf_counter()
                sb = await backend.start(SandboxSpec(layers=env.layers, workdir=env.workdir))
                r = await sb.exec("cat /app/marker")
                t2 = time.perf_counter()
                await sb.close()
                if not r.ok:
                    return {"error": f"cold sandbox did not see its layer: {r}"}
            except Exception as exc:  # report honestly, keep the other numbers
                return {"error": f"{type(exc).__name__}: {exc}"}
            totals.append(t2 - t0)
            builds.append(t1 - t0)
            starts.append(t2 - t1)
    return {**summary(totals), "build_ms": summary(builds), "start_and_first_exec_ms": summary(starts),
            "what": "fresh Dockerfile (WORKDIR + one RUN, unique) built into an empty layer "
                    "cache on the cached base, then sandbox start + first command"}


def _verdict(out: dict[str, Any]) -> dict[str, Any]:
    got = {
        "warm_start_p50_ms": out["warm_start_ms"]["p50"],
        "fork8_p50_ms": out["fork8_ms"]["p50"],
        "exec_overhead_ms": out["exec"]["overhead_ms"],
        "host_mb_per_idle_sandbox": out["concurrent"]["host_mb_per_idle_sandbox"],
    }
    return {k: {"target": TARGETS[k], "measured": v, "met": v <= TARGETS[k]} for k, v in got.items()}


def _mean(xs: list[int] | list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _cpu_s() -> float:
    """CPU seconds used so far by this process and its reaped children (user + system)."""
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _smaps_rollup(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                out[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        pass
    return out


def _meminfo_available_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0
