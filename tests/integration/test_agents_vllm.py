"""Integration: unmodified agent programs collect real batches (real vLLM CPU server with
SmolLM2-135M-Instruct behind the real gateway, real sandboxes, the tasks' real verifiers).

A 135M model mostly fails the tasks: the test checks the plumbing — every attempt attributed
to one outcome, a trainable one rewarded by the verifier, the Parquet batch's model tokens
exactly the gateway's engine outputs (count per request, finite behaviour log-probs, version
0), everything else mask 0. One managed server is shared by the module."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import pytest_asyncio

from rollbank.collect_config import CollectConfig, load_collect_config
from rollbank.collector import collect
from rollbank.episodes.sandboxes import open_sandboxes
from rollbank.inference_plane import InferencePlane, open_inference
from rollbank.task_selection import select_tasks

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

AGENTS: dict[str, tuple[str, dict[str, object]]] = {
    "mini-swe-agent": ("rollbank.agents.mini_swe_agent:agent", {"step_limit": 2, "max_tokens": 48}),
    "smolagents": ("rollbank.agents.smolagents_agent:agent", {"max_steps": 1, "max_tokens": 48}),
}


def config(out: Path, entry: str = "rollbank.agents.mini_swe_agent:agent",
           options: dict[str, object] | None = None) -> CollectConfig:
    return load_collect_config(None, {
        "include": ["hello-greeting"], "output": str(out), "metrics.live": "off",
        "metrics.report": False, "harness": "agent", "agent.entry": entry,
        "agent.options": options or {}, "agent.timeout_s": 240.0,
        "scheduler.groups_per_batch": 1, "scheduler.pool_groups": 1,
        "scheduler.bank.group_size": 2, "scheduler.sandbox_slots": 2,
        "scheduler.bank.dynamic_sampling.enabled": False,
        "inference.managed.model": "smollm2-135m-instruct", "inference.managed.num_servers": 1,
        "inference.managed.kv_cache_gib": 1.0, "inference.calibrate": False,
    })


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plane(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[InferencePlane]:
    cfg = config(tmp_path_factory.mktemp("srv"))
    async with open_inference(cfg.inference, max_model_len=cfg.runner.max_model_len) as p:
        yield p


@pytest.mark.parametrize("name", list(AGENTS))
async def test_an_unmodified_agent_collects_a_real_batch(plane: InferencePlane, tmp_path: Path,
                                                          name: str) -> None:
    entry, options = AGENTS[name]
    cfg = config(tmp_path / "run", entry, options)
    tasks = select_tasks(cfg)
    async with open_sandboxes(cfg.sandbox, tasks) as sandboxes:
        result = await collect(cfg, tasks=tasks, inference=plane, sandboxes=sandboxes,
                               out_dir=tmp_path / "run")
    (batch,) = result.batches
    assert batch.n_trajectories == 2
    by_id = {t.trajectory_id: t for t in result.trajectories}
    rows = pq.read_table(next((tmp_path / "run" / "batches").glob("*/trajectories.parquet")))
    for row in rows.to_pylist():
        t = by_id[row["trajectory_id"]]
        assert t.outcome is not None and t.meta["harness"] == "agent"
        assert row["outcome"] in ("model_success", "model_failure")  # the batch: trainable only
        assert row["reward"] is not None and t.verify_s > 0  # the task's verifier ran
        gw = t.meta["gateway"]
        assert gw["requests"] >= 1
        mask, lps, vers = row["loss_mask"], row["logprobs"], row["policy_versions"]
        assert sum(mask) == sum(gw["output_tokens"]) > 0  # model tokens = the engine's outputs
        assert row["token_ids"] == t.token_ids
        assert all(math.isfinite(lp) and lp <= 0 and v == 0
                   for lp, v, m in zip(lps, vers, mask, strict=True) if m)
        assert all(lp == 0.0 and v == -1 for lp, v, m in zip(lps, vers, mask, strict=True) if not m)
    for t in result.trajectories:  # every attempt, in the batch or not, has one outcome
        assert t.outcome is not None
