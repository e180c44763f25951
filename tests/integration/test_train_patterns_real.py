"""Integration: ``rollbank train`` with each publication pattern on real parts (one managed vLLM
server with the tiny model, real bubblewrap sandboxes, the built-in trainer), 2 steps of 2x2.

- ``direct`` (full fine-tuning; tensors over vLLM's weight-sync routes + rollbank_shm) and
  ``lora`` (LoRA fine-tuning; a new adapter per version), sync: the engine's own version
  advances to the trainer's, the batches' per-token versions go {0} -> {1}, publication latency
  and apply pause are recorded apart in train.jsonl, by the named pattern;
- ``checkpoint`` in async mode with the ``pause`` plan (refused before: vLLM refuses a plain
  prefix-cache reset while frozen requests hold blocks): requests salted by version, no reset;
  the divergence gate on (async's default), its decisions in each step record.
(``checkpoint`` sync is tests/integration/test_train_real.py.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from rollbank.batching.writer import PARQUET_NAME, ready_batches
from rollbank.episodes.sandboxes import open_sandboxes
from rollbank.inference.vllm_client import VLLMClient
from rollbank.inference_plane import open_inference
from rollbank.task_selection import select_tasks
from rollbank.training.loop_config import load_train_config
from rollbank.training.loop_run import BuiltinTrainer, TrainResult, train_with

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

SMALL = {
    "collect.include": ["hello-greeting", "count-lines"],
    "collect.scheduler.groups_per_batch": 2, "collect.scheduler.pool_groups": 2,
    "collect.scheduler.bank.group_size": 2, "collect.fenced_shell.max_tokens": 32,
    "collect.metrics.report": False, "loop.steps": 2,
}


async def _train(out: Path, overrides: dict[str, Any]) -> tuple[TrainResult, list[dict[str, Any]]]:
    config = load_train_config(None, {**SMALL, "collect.output": str(out), **overrides})
    tasks = select_tasks(config.collect)
    async with (
        open_inference(config.collect.inference, max_model_len=config.collect.runner.max_model_len) as plane,
        open_sandboxes(config.collect.sandbox, tasks) as sandboxes,
    ):
        (client,) = plane.clients.values()
        assert isinstance(client, VLLMClient)
        assert await client.engine_version() == 0
        result = await train_with(config, tasks=tasks, inference=plane, sandboxes=sandboxes,
                                  out_dir=out, trainer=BuiltinTrainer(config.trainer))
        # the engine serves the trainer's last version
        assert await client.engine_version() == result.summary["final_version"]
        assert client.salt_by_version is config.loop.cache_salt
    records = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    return result, records


def _check_publications(records: list[dict[str, Any]], pattern: str) -> None:
    pubs = [r for r in records if r["kind"] == "publication"]
    assert [p["version"] for p in pubs] == [1, 2]
    for p in pubs:  # latency (step done -> serving) and apply pause recorded apart
        assert p["detail"]["pattern"] == pattern and p["detail"]["ok"]
        assert 0 < p["apply_pause_s"] <= p["publication_s"]


@pytest.mark.parametrize("pattern", ["direct", "lora"])
async def test_rollbank_train_sync_with_each_pattern(tmp_path: Path, pattern: str) -> None:
    out = tmp_path / "run"
    # compact off: every tensor travels (with rewards 0 on these tasks the step's gradient is 0
    # and a compact update would send nothing)
    extra: dict[str, Any] = {"loop.publisher": pattern, "loop.compact": False}
    if pattern == "lora":
        extra.update({"trainer.finetune": "lora", "trainer.lora.rank": 8})
    result, records = await _train(out, extra)
    summary = result.summary
    assert summary["final_version"] == summary["served_version"] == 2
    steps = summary["steps"]
    assert [sorted(s["versions"]) for s in steps] == [["0"], ["1"]]  # engine-reported versions
    _check_publications(records, pattern)
    for k, d in enumerate(ready_batches(out / "batches")):
        table = pq.read_table(d / PARQUET_NAME)
        versions = {v for row in table.column("policy_versions").to_pylist() for v in row if v >= 0}
        assert versions == {k}
    if pattern == "direct":  # every tensor went over the weight-sync routes; the checkpoint follows
        pubs = [r for r in records if r["kind"] == "publication"]
        assert all(p["detail"]["tensors"] == 39 and p["detail"]["bytes"] > 0 for p in pubs)
        assert (out / "weights" / "v000002" / "model.safetensors").is_file()
    else:
        assert (out / "weights" / "v000002" / "adapter_model.safetensors").is_file()


async def test_rollbank_train_async_pause_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result, records = await _train(out, {"loop.mode": "async", "loop.inflight": "pause"})
    summary = result.summary
    # a batch older than max_lag would be dropped as stale (not trained on): then fewer versions
    assert summary["final_version"] == summary["served_version"] == len(summary["steps"]) >= 1
    pubs = [r for r in records if r["kind"] == "publication"]
    assert [p["version"] for p in pubs] == list(range(1, len(pubs) + 1))
    for p in pubs:
        assert p["detail"]["pattern"] == "checkpoint" and p["detail"]["plan"] == "pause"
        assert 0 < p["apply_pause_s"] <= p["publication_s"]
        steps = p["detail"]["steps_s"]
        assert steps["cache_reset_failed"] == 0 and steps["cache_reset_skipped"] == 1  # salted
    assert all(s["policy_age"] <= 1 for s in summary["steps"])
    # async: the divergence gate is on by default; its decisions are in every step record
    for s in summary["steps"]:
        gate = s["gate"]
        assert gate["enabled"] and gate["scorer"] == "engine_prompt_logprobs"
        assert gate["admitted"] + gate["downweighted"] >= 1  # judged and kept rows were trained
