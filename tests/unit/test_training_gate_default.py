"""The divergence gate in collection follows ``rollbank train``'s mode: on by default in
``async`` (weights move while collecting), off in ``sync``; an explicit setting always wins;
fake inference (nothing can score) keeps it off. Its decisions reach ``train.jsonl``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from rollbank.batching.loader import TensorBatch
from rollbank.inference.protocol import AdmissionGate
from rollbank.inference.publishing.protocol import PublicationRecord, WeightUpdate
from rollbank.staleness.gate import GateCounters
from rollbank.staleness.report import staleness_report
from rollbank.training.loop import TrainingLoop
from rollbank.training.loop_config import LoopSettings, TrainConfig, load_train_config
from rollbank.training.loop_metrics import gate_record, progress_line

ENABLED = "collect.staleness.collection.enabled"


def _enabled(c: TrainConfig) -> bool:
    return c.collect.staleness.collection.enabled


def test_embedded_default_is_sync_without_the_gate() -> None:
    c = load_train_config(None)
    assert c.loop.mode == "sync" and not _enabled(c)


def test_async_turns_the_gate_on_by_default() -> None:
    c = load_train_config(None, {"loop.mode": "async", "loop.max_lag": 2})
    assert _enabled(c)
    assert c.collect.staleness.collection.scorer == "engine"  # the serving engine scores
    # the same rule when a config is built directly (not only through the TOML loader)
    full = {"trainer": {"finetune": "full", "model": "tiny", "temperature": 0.8},
            "collect": {"scheduler": {"num_batches": 2}}}
    assert _enabled(TrainConfig.model_validate(full | {"loop": {"mode": "async"}}))
    assert _enabled(TrainConfig.model_validate(full | {"loop": LoopSettings(mode="async")}))
    assert not _enabled(TrainConfig.model_validate(full | {"loop": {"mode": "sync"}}))


@pytest.mark.parametrize(("mode", "value"), [("async", False), ("sync", True)])
def test_an_explicit_setting_wins(mode: str, value: bool) -> None:
    c = load_train_config(None, {"loop.mode": mode, ENABLED: value})
    assert _enabled(c) is value


def test_fake_inference_keeps_it_off() -> None:
    c = load_train_config(None, {"loop.mode": "async", "collect.inference.kind": "fake"})
    assert not _enabled(c)


class _Staleness:
    def __init__(self, report: dict[str, Any]) -> None:
        self.report = report


def _report() -> dict[str, Any]:
    counters = GateCounters(trajectories=4, admitted=2, downweighted=1, retried=1, groups=1,
                            groups_with_retry=1)
    counters.reasons.update({"k3": 2, "within_thresholds": 2})
    return staleness_report(None, counters=counters, current_version=3,
                            scorer="engine_prompt_logprobs")


def test_gate_record() -> None:
    assert gate_record(None) == {"enabled": False}
    rec = gate_record(_Staleness(_report()))
    assert rec["enabled"] and rec["scorer"] == "engine_prompt_logprobs"
    assert (rec["admitted"], rec["downweighted"], rec["retried"], rec["excluded"]) == (2, 1, 1, 0)
    assert rec["reasons"] == {"k3": 2, "within_thresholds": 2} and rec["current_version"] == 3


class _Trainer:
    def train(self, batch: TensorBatch) -> dict[str, float]:
        return {"loss": 0.0}

    def save(self, root: Path, version: int) -> Path:
        (root / f"v{version:06d}").mkdir(parents=True)
        return root / f"v{version:06d}"

    def tensors(self) -> dict[str, Any]:
        return {}


class _Publisher:
    pattern: Literal["checkpoint"] = "checkpoint"
    wants_tensors = False
    version = 0

    async def publish(self, update: WeightUpdate, *, version: int,
                      ready_at: float | None = None) -> PublicationRecord:
        previous, self.version = self.version, version
        return PublicationRecord("checkpoint", version, previous, "finish", 0.0, 0.0, 0.01, 0.02)

    async def aclose(self) -> None:
        return None


class _Batch:
    def __init__(self, index: int, staleness: _Staleness | None) -> None:
        self.index = index
        self.staleness = staleness


def _tensors() -> TensorBatch:
    ones = torch.ones((1, 3))
    return TensorBatch(
        input_ids=torch.ones((1, 3), dtype=torch.long), attention_mask=ones, loss_mask=ones,
        old_logprobs=torch.zeros((1, 3)), advantages=torch.zeros(1), rewards=torch.zeros(1),
        policy_versions=torch.zeros((1, 3), dtype=torch.int32), prompt_lens=torch.zeros(1, dtype=torch.long),
        group_index=torch.zeros(1, dtype=torch.long), trajectory_ids=("t",),
    )


async def test_each_step_record_carries_the_gate_decisions(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = []
    lines: list[str] = []
    loop = TrainingLoop(LoopSettings(mode="sync", steps=2), _Trainer(), _Publisher(),
                        gate=AdmissionGate(), servers=["a"], weights_root=tmp_path / "w",
                        record=records.append, progress=lines.append,
                        load=lambda _p: _tensors())
    await loop.on_batch(_Batch(0, _Staleness(_report())), tmp_path / "b0")  # type: ignore[arg-type]
    await loop.on_batch(_Batch(1, None), tmp_path / "b1")  # type: ignore[arg-type]
    steps = [r for r in records if r["kind"] == "step"]
    assert steps[0]["gate"]["enabled"] and steps[0]["gate"]["retried"] == 1
    assert steps[1]["gate"] == {"enabled": False}
    assert "gate admit 2 down 1 retry 1 excl 0" in lines[0] and "gate" not in lines[1]
    assert progress_line(steps[1], 2) == lines[1]
