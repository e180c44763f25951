"""Integration: collections whose sandboxes run on a real multi-node Ray cluster on this host.

Each test starts its own cluster (``ray.cluster_utils.Cluster``: a head with no CPU and
worker raylets, separate processes, each offering a distinct amount of ``sandbox_slots``) and
shuts it down (``ray.shutdown`` + ``Cluster.shutdown``: every Ray process it started). The
collection is real apart from inference: the fake engine, the trace workload (each turn
really sleeps in the sandbox), real bubblewrap sandboxes hosted by the per-node actors,
the real verifier, batches written to disk.

(a) sandboxes land on both workers, and the node actors import this rollbank;
(b) a worker killed mid-run: its attempts end as infra failures (never the model's) and are
    re-run on the other node; nothing is lost, the batches are complete;
(c) a worker added mid-run: the scheduler's sandbox slots grow and attempts run there.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import rollbank
from rollbank.collect_config import CollectConfig, load_collect_config
from rollbank.collector import CollectResult, collect
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.sandboxes import open_sandboxes
from rollbank.episodes.trajectory import Trajectory
from rollbank.inference_plane import open_inference
from rollbank.sandbox.ray.backend import RaySandboxBackend
from rollbank.task_selection import select_tasks

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.integration

TASKS = ["hello-greeting", "count-lines"]


@dataclass
class Ray:
    cluster: Any
    workers: list[Any]  # ray._private.node.Node of each worker raylet


@pytest.fixture
def rayc() -> Iterator[Ray]:
    """Head (no CPU, no slots) + worker A (2 slots) + worker B (3 slots)."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        workers = [cluster.add_node(num_cpus=1, resources={"sandbox_slots": 2}),
                   cluster.add_node(num_cpus=1, resources={"sandbox_slots": 3})]
        ray.init(address=cluster.address, namespace="rollbank-test", log_to_driver=False)
        yield Ray(cluster, workers)
    finally:
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]


def config(out: Path, address: str, **extra: object) -> CollectConfig:
    return load_collect_config(None, {
        "include": TASKS, "output": str(out), "metrics.live": "off", "metrics.report": False,
        "inference.kind": "fake", "inference.calibrate": False,
        "workload.kind": "trace", "workload.turns_median": 2, "workload.turns_task_sigma": 0.3,
        "workload.tool_latency_median_s": 0.6, "workload.tool_latency_sigma": 0.3,
        "workload.tokens_min": 4, "workload.tokens_max": 8,
        "scheduler.groups_per_batch": 2, "scheduler.pool_groups": 3,
        "scheduler.bank.group_size": 2, "scheduler.num_batches": 2,
        "sandbox.ray.address": address, "sandbox.ray.node_poll_s": 0.3,
        "sandbox.local.run_dir": str(out.parent / "sandboxes"),
    } | extra)


def node_of(t: Trajectory) -> str:
    return str(t.meta["sandbox_id"]).split(":", 1)[0]


async def until(predicate: Any, timeout_s: float = 180.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def check_complete(result: CollectResult, cfg: CollectConfig) -> dict[str, Any]:
    """Every batch complete, the ledger balanced, nothing infra in the batches."""
    sched = cfg.scheduler
    assert len(result.batches) == sched.num_batches
    summary = json.loads((result.out_dir / "summary.json").read_text())
    ledger: dict[str, Any] = summary["ledger"]
    assert ledger["launched"] == ledger["consumed"] + ledger["retried"] + ledger["waste"]
    for b in summary["batches"]:
        assert b["extra"]["complete"], b
        assert b["n_groups"] == sched.groups_per_batch
        assert b["n_trajectories"] == sched.groups_per_batch * sched.bank.group_size
    return ledger


async def run(cfg: CollectConfig, out: Path, *, during: Any = None) -> CollectResult:
    """One collection on the cluster; ``during(backend)`` runs alongside it."""
    tasks = select_tasks(cfg)
    async with open_inference(cfg.inference, max_model_len=cfg.runner.max_model_len) as plane, \
            open_sandboxes(cfg.sandbox, tasks) as sandboxes:
        backend = sandboxes.capacity
        assert isinstance(backend, RaySandboxBackend)
        side = None if during is None else asyncio.create_task(during(backend))
        try:
            result = await collect(cfg, tasks=tasks, inference=plane, sandboxes=sandboxes,
                                   out_dir=out)
        finally:
            if side is not None:
                side.cancel()
                await asyncio.gather(side, return_exceptions=True)
        result.ledger["infos"] = backend.infos
        return result


async def test_sandboxes_land_on_both_workers(rayc: Ray, tmp_path: Path) -> None:
    cfg = config(tmp_path / "run", rayc.cluster.address)
    result = await run(cfg, tmp_path / "run")
    check_complete(result, cfg)
    workers = {w.node_id for w in rayc.workers}
    infos = result.ledger["infos"]
    assert set(infos) == workers  # one host actor per worker, none on the slot-less head
    for info in infos.values():  # the actors import this very rollbank (the driver's path)
        assert info["rollbank"] == rollbank.__file__
    used = {node_of(t) for t in result.trajectories}
    assert used == {w[:8] for w in workers}, used
    infra = [t.outcome.to_dict() for t in result.trajectories
             if t.outcome is not None and t.outcome.outcome is Outcome.INFRA_FAILURE]
    assert not infra, infra
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    assert [e["sandbox_slots"] for e in events if e["kind"] == "capacity"] == [5]


async def test_a_worker_killed_mid_run_reruns_its_attempts_as_infra(
        rayc: Ray, tmp_path: Path) -> None:
    cfg = config(tmp_path / "run", rayc.cluster.address,
                 **{"workload.tool_latency_median_s": 1.0})
    victim = rayc.workers[0]
    killed: list[tuple[int, float]] = []  # (sandboxes on the node, collector clock)

    async def kill_when_busy(backend: RaySandboxBackend) -> None:
        await until(lambda: any(sb.node.node_id == victim.node_id for sb in backend.sandboxes))
        await asyncio.sleep(0.5)  # mid-episode
        on_it = sum(sb.node.node_id == victim.node_id for sb in backend.sandboxes)
        killed.append((on_it, time.monotonic()))
        await asyncio.to_thread(rayc.cluster.remove_node, victim)

    result = await run(cfg, tmp_path / "run", during=kill_when_busy)
    ((on_it, t_kill),) = killed
    assert on_it > 0  # attempts were running on the node when it died
    ledger = check_complete(result, cfg)
    lost = [t for t in result.trajectories if node_of(t) == victim.node_id[:8]
            and t.finished_at is not None and t.finished_at >= t_kill]
    assert lost, "no attempt was cut by the node's death"
    for t in lost:  # the node's death is never the model's failure
        assert t.outcome is not None
        assert t.outcome.outcome is Outcome.INFRA_FAILURE, t.outcome.to_dict()
    assert ledger["retried"] >= len(lost)
    # cut mid-episode: sandbox_died with the node_lost evidence (no experiment); cut while
    # starting there: sandbox_start_failed
    assert {t.outcome.reason for t in lost if t.outcome} <= {Reason.SANDBOX_DIED,
                                                             Reason.SANDBOX_START_FAILED}
    assert any(t.outcome and t.outcome.evidence.get("node_lost") for t in lost)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    assert [e["sandbox_slots"] for e in events if e["kind"] == "capacity"] == [5, 3]
    retried = {e["attempt_id"] for e in events if e["kind"] == "retried"}
    assert {t.trajectory_id for t in lost} <= retried
    # the re-runs that came after the death ran on the surviving node
    reruns = {node_of(t) for t in result.trajectories if t.retry > 0}
    assert reruns and reruns <= {rayc.workers[1].node_id[:8]}, reruns


def test_a_worker_added_mid_run_grows_the_capacity(rayc: Ray, tmp_path: Path) -> None:
    """Sync test: ``Cluster.add_node`` must run on the main thread (it installs signal
    handlers), so the collection runs on a thread of its own, with its own event loop."""
    rayc.cluster.remove_node(rayc.workers[1])  # start with worker A alone: 2 slots
    cfg = config(tmp_path / "run", rayc.cluster.address, **{
        "scheduler.groups_per_batch": 4, "scheduler.pool_groups": 6,
        "scheduler.num_batches": 2, "workload.tool_latency_median_s": 1.0})
    out: dict[str, Any] = {}
    started = threading.Event()

    async def watch_start(backend: RaySandboxBackend) -> None:
        await until(lambda: bool(backend.sandboxes))
        out["capacity_before"] = backend.capacity
        started.set()

    def collect_thread() -> None:
        try:
            out["result"] = asyncio.run(run(cfg, tmp_path / "run", during=watch_start))
        except BaseException as exc:
            out["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=collect_thread, name="collector")
    thread.start()
    try:
        started.wait(180)
        assert "error" not in out, out.get("error")
        added = rayc.cluster.add_node(num_cpus=1, resources={"sandbox_slots": 4})
    finally:
        thread.join(300)
    assert not thread.is_alive()
    if "error" in out:
        raise out["error"]
    result: CollectResult = out["result"]
    assert out["capacity_before"] == 2
    check_complete(result, cfg)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    assert [e["sandbox_slots"] for e in events if e["kind"] == "capacity"] == [2, 6]
    assert added.node_id[:8] in {node_of(t) for t in result.trajectories}
    # more attempts held a sandbox at once than the first node's 2 slots allowed
    running = peak = 0
    for e in events:
        if e["kind"] == "launched":
            running += 1
            peak = max(peak, running)
        elif e["kind"] in ("finished", "aborted"):
            running -= 1
    assert peak > 2, peak


def test_collect_command_with_ray_address(rayc: Ray, tmp_path: Path) -> None:
    """`rollbank collect --ray ADDRESS` in a process of its own (it joins the cluster itself)."""
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    cmd = [sys.executable, "-c", "from rollbank.cli.main import main; raise SystemExit(main())",
           "collect", "--ray", rayc.cluster.address, "--inference.kind", "fake",
           "--inference.calibrate", "false", "--metrics.live", "off", "--metrics.report", "false",
           "--workload.kind", "trace", "--workload.turns-median", "2",
           "--workload.tool-latency-median-s", "0.3", "--groups", "2", "--group-size", "2",
           "--pool-groups", "2", "--batches", "1", "--set", f"include={json.dumps(TASKS)}",
           "--sandbox.local.run-dir", str(tmp_path / "sandboxes"), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(rollbank.__file__).parents[1])}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["batches"]) == 1 and summary["batches"][0]["extra"]["complete"]
    events = [json.loads(line) for line in (out / "events.jsonl").open()]
    assert [e["sandbox_slots"] for e in events if e["kind"] == "capacity"] == [5]
    resolved = json.loads((out / "config.resolved.json").read_text())
    assert resolved["sandbox"]["ray"]["address"] == rayc.cluster.address
