"""``rollbank bench sandbox --ray [ADDRESS]``: start, fork and exec through Ray vs local.

Owns the side-by-side comparison. Both backends run in the same process and the same run,
samples interleaved (local, Ray, local, Ray...) so that a busy shared host weighs on both
alike. What each number means:

* ``warm_start_ms``: ``backend.fork(snapshot, 1)`` until it returns (the snapshot holds one
  frozen layer over the Debian base); ``warm_ready_ms`` adds the first ``true``.
* ``fork8_ms``: ``backend.fork(snapshot, 8)`` until all 8 siblings are ready.
* ``exec_ms``: ``true`` run in a started sandbox (``Sandbox.exec``).
* ``ray_call_ms`` (Ray only): one awaited call to the node's host actor that does nothing
  (the transport alone).
* ``overhead_ms``: Ray p50 minus local p50 of each measure (the target: exec overhead
  through Ray <= 5 ms).

Without ADDRESS (``--ray`` alone) a cluster is started on this host for the run
(``ray.cluster_utils.Cluster``: a head with no CPU and one worker raylet offering
``sandbox_slots``) and shut down after; with ADDRESS the cluster there is used.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

TARGET_EXEC_OVERHEAD_MS = 5.0
LOCAL_CLUSTER = "local"


def run_ray(args: argparse.Namespace) -> dict[str, Any]:
    """Start a cluster here if asked (on the main thread: Ray installs signal handlers)."""
    from rollbank.sandbox.ray.cluster import ray_module

    ray = ray_module()
    cluster: Any = None
    address = args.ray
    if address == LOCAL_CLUSTER:
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        cluster.add_node(num_cpus=1, resources={"sandbox_slots": 16})
        address = cluster.address
        ray.init(address=address, log_to_driver=False, logging_level="WARNING")
    try:
        out = asyncio.run(_compare(args, address))
        out["cluster"] = "started for this run on this host (head + 1 worker raylet)" \
            if cluster is not None else address
        return out
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


async def _compare(args: argparse.Namespace, address: str) -> dict[str, Any]:
    import tempfile

    from rollbank.sandbox.local.backend import LocalBackend
    from rollbank.sandbox.local.config import LocalSandboxConfig
    from rollbank.sandbox.protocol import SandboxBackend, SandboxSpec, Snapshot
    from rollbank.sandbox.ray.backend import RaySandboxBackend
    from rollbank.sandbox.ray.config import RaySandboxConfig
    from rollbank.tasks.bases import ensure_base
    from rollbank_bench.timing import summary

    base = ensure_base("ubuntu:24.04").path
    spec = SandboxSpec(layers=(base,))
    out: dict[str, Any] = {"host": {"cpus": os.cpu_count(),
                                    "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
                           "definitions": "see the docstring of rollbank_bench.sandbox_ray"}
    with tempfile.TemporaryDirectory(prefix="rb-bench-ray-") as tmp:
        local_cfg = LocalSandboxConfig(run_dir=args.run_dir or Path(tmp) / "run")
        async with LocalBackend(local_cfg) as local, \
                RaySandboxBackend(RaySandboxConfig(address=address), local_cfg) as remote:
            arms: dict[str, SandboxBackend] = {"local": local, "ray": remote}
            snaps: dict[str, Snapshot] = {}
            for name, backend in arms.items():
                seed = await backend.start(spec)
                await seed.exec("mkdir -p /app && echo prepared > /app/state.txt")
                snaps[name] = await seed.snapshot()
                await seed.close()
            times: dict[str, dict[str, list[float]]] = {n: {} for n in arms}

            async def sample(measure: str, fn: Callable[[str], Awaitable[float]]) -> None:
                for _ in range(args.samples if measure != "fork8_ms" else args.fork_samples):
                    for name in arms:
                        times[name].setdefault(measure, []).append(await fn(name))

            async def warm(name: str) -> float:
                t0 = time.perf_counter()
                (sb,) = await arms[name].fork(snaps[name], 1)
                t1 = time.perf_counter()
                r = await sb.exec("true")
                times[name].setdefault("warm_ready_ms", []).append(time.perf_counter() - t0)
                assert r.ok, r
                await sb.close()
                return t1 - t0

            async def fork8(name: str) -> float:
                t0 = time.perf_counter()
                group = await arms[name].fork(snaps[name], 8)
                took = time.perf_counter() - t0
                await asyncio.gather(*(s.close() for s in group))
                return took

            await sample("warm_start_ms", warm)
            await sample("fork8_ms", fork8)
            held = {name: (await arms[name].fork(snaps[name], 1))[0] for name in arms}

            async def exec_true(name: str) -> float:
                t0 = time.perf_counter()
                r = await held[name].exec("true")
                assert r.ok, r
                return time.perf_counter() - t0

            await sample("exec_ms", exec_true)
            node = next(iter(remote.nodes.values()))
            calls = []
            for _ in range(args.samples):
                t0 = time.perf_counter()
                await node.call("info")
                calls.append(time.perf_counter() - t0)
            for sb in held.values():
                await sb.close()
    for name in arms:
        out[name] = {k: summary(v) for k, v in times[name].items()}
    out["ray"]["ray_call_ms"] = summary(calls)
    out["overhead_ms"] = {k: _diff(out["ray"][k]["p50"], out["local"][k]["p50"])
                          for k in out["local"]}
    exec_over = out["overhead_ms"]["exec_ms"]
    out["targets"] = {"exec_overhead_ms": {"target": TARGET_EXEC_OVERHEAD_MS,
                                           "measured": exec_over,
                                           "met": exec_over is not None
                                           and exec_over <= TARGET_EXEC_OVERHEAD_MS}}
    out["host"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 2)
