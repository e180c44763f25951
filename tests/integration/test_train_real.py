"""Integration: the closed loop on real parts (one managed vLLM server with the tiny model,
real bubblewrap sandboxes, the built-in trainer, checkpoint hot-load), sync, 2 steps of 2x2.

Checks what ``rollbank train`` promises: the engine's own version (``GET /weight_info``)
advances to the trainer's, the Parquet batches' per-token versions go from 0 to 1, the weights
written per version are loadable checkpoints, rewards and losses are recorded per step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rollbank.batching.writer import PARQUET_NAME, ready_batches
from rollbank.episodes.sandboxes import open_sandboxes
from rollbank.inference.vllm_client import VLLMClient
from rollbank.inference_plane import open_inference
from rollbank.task_selection import select_tasks
from rollbank.training.checkpoint import latest_version, read_meta
from rollbank.training.loop_config import load_train_config
from rollbank.training.loop_run import BuiltinTrainer, train_with

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


async def test_rollbank_train_sync_two_steps(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = load_train_config(None, {
        "collect.output": str(out), "collect.include": ["hello-greeting", "count-lines"],
        "collect.scheduler.groups_per_batch": 2, "collect.scheduler.pool_groups": 2,
        "collect.scheduler.bank.group_size": 2, "collect.fenced_shell.max_tokens": 32,
        "collect.metrics.report": False, "loop.steps": 2,
    })
    tasks = select_tasks(config.collect)
    lines: list[str] = []
    async with (
        open_inference(config.collect.inference, max_model_len=config.collect.runner.max_model_len) as plane,
        open_sandboxes(config.collect.sandbox, tasks) as sandboxes,
    ):
        (client,) = plane.clients.values()
        assert isinstance(client, VLLMClient)
        assert await client.engine_version() == 0
        result = await train_with(config, tasks=tasks, inference=plane, sandboxes=sandboxes,
                                  out_dir=out, trainer=BuiltinTrainer(config.trainer),
                                  progress=lines.append)
        assert await client.engine_version() == 2  # the engine serves what the trainer wrote
    summary = result.summary
    assert summary["final_version"] == summary["served_version"] == 2
    steps = summary["steps"]
    assert [s["version"] for s in steps] == [1, 2]
    assert [sorted(s["versions"]) for s in steps] == [["0"], ["1"]]  # engine-reported versions
    assert [s["policy_age"] for s in steps] == [0, 0]
    for s in steps:
        assert s["publication_s"] > 0 and 0 < s["apply_pause_s"] <= s["publication_s"]
        assert s["loss"] == s["loss"] and s["reward_mean"] >= 0  # recorded (not NaN)
    # the Parquet batches carry the per-token versions the engine reported
    dirs = ready_batches(out / "batches")
    assert len(dirs) == 2
    for k, d in enumerate(dirs):
        table = pq.read_table(d / PARQUET_NAME)
        versions = {v for row in table.column("policy_versions").to_pylist() for v in row if v >= 0}
        assert versions == {k}
    weights = out / "weights"
    assert latest_version(weights) == 2
    assert read_meta(weights / "v000002")["kind"] == "full"
    assert (weights / "v000002" / "model.safetensors").is_file()
    records = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records] == ["publication", "step"] * 2
    assert len(lines) == 2 and lines[0].startswith("step 1/2")
