"""The training loop against fakes: fake inference servers (engine-side per-token versions),
fake sandboxes, the publication seam's checkpoint pattern on fake clients, a fake trainer.

- sync: collect -> train -> save -> publish in that order, no token generated between a batch
  hand-off and the next publication, batch k's tokens all of version k.
- async: generation continues during training; no trained batch is older than max_lag; a batch
  that is too old is recorded as stale and never reaches the trainer.
- the router forgets affinity on every version change; a failed publication reopens admission.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from episode_rig import FileVerifier, fake_spec, make_task

from rollbank.batching.loader import TensorBatch
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import SandboxPlane
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.protocol import AdmissionGate, GenerateRequest
from rollbank.inference.publishing import (
    CheckpointPublisher,
    Pattern,
    PublicationRecord,
    Publisher,
    WeightUpdate,
)
from rollbank.inference_plane import InferencePlane
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool
from rollbank.scheduling.policy.events import BatchEvent, Event, EventKind
from rollbank.training.loop import TrainingLoop, batch_versions
from rollbank.training.loop_config import LoopSettings, TrainConfig, load_train_config
from rollbank.training.loop_run import TrainResult, train_with

TOK = FakeTokenizer()


def _model(log: list[str]) -> Any:
    def respond(req: GenerateRequest) -> str:
        log.append(f"gen {req.request_id}")
        slot = int(req.request_id.split("/s")[1].split("/")[0])
        if "\nOutput:" in TOK.decode(list(req.prompt_token_ids)).split("Task: Write hello")[-1]:
            return "DONE\n"
        return "```bash\necho hello > out.txt\n```\n" if slot % 2 == 0 else "DONE\n"
    return respond


class FakeTrainer:
    """Records what it trained on; ``hold[k]`` = wait for that event before step k returns."""

    def __init__(self, log: list[str], hold: dict[int, threading.Event] | None = None) -> None:
        self.log = log
        self.hold = hold or {}
        self.trained: list[tuple[str, ...]] = []

    def train(self, batch: TensorBatch) -> dict[str, float]:
        step = len(self.trained) + 1
        if step in self.hold:
            assert self.hold[step].wait(30), f"step {step} was never released"
        self.trained.append(batch.trajectory_ids)
        self.log.append(f"train {step}")
        return {"loss": 0.5 * step, "clip_fraction": 0.0}

    def tensors(self) -> dict[str, Any]:
        self.log.append(f"tensors {len(self.trained)}")
        return {"w": torch.full((2,), float(len(self.trained)))}

    def save(self, root: Path, version: int) -> Path:
        from safetensors.torch import save_file

        path = root / f"v{version:06d}"
        path.mkdir(parents=True)
        save_file({"w": torch.full((2,), float(len(self.trained)))},  # a checkpoint to validate
                  str(path / "model.safetensors"))
        self.log.append(f"save {version}")
        return path


class Sink:
    """Logs batch hand-offs; sets ``ready[k]`` when batch k is emitted."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.ready: dict[int, threading.Event] = {}

    def event(self, k: int) -> threading.Event:
        return self.ready.setdefault(k, threading.Event())

    def emit(self, event: Event) -> None:
        if event.kind is EventKind.BATCH_READY and isinstance(event, BatchEvent):
            self.log.append(f"ready {event.batch_index}")
            self.event(event.batch_index).set()


def _config(mode: str, steps: int, max_lag: int = 1, **extra: Any) -> TrainConfig:
    return load_train_config(None, extra | {
        "loop.mode": mode, "loop.steps": steps, "loop.max_lag": max_lag,
        "collect.inference.kind": "fake", "collect.inference.calibrate": False,
        "collect.runner.max_model_len": 4096,  # the fake tokenizer is byte-level
        "collect.metrics.live": "off", "collect.metrics.report": False,
        "collect.task_order_seed": None, "collect.include": [],
        "collect.scheduler.groups_per_batch": 1, "collect.scheduler.pool_groups": 1,
        "collect.scheduler.bank.group_size": 2, "collect.scheduler.sandbox_slots": 4,
        "collect.scheduler.inference_slots_per_server": 2,
    })


class LoggingPublisher:
    """A publisher of the seam that logs each publication it passed on."""

    def __init__(self, inner: Publisher, log: list[str]) -> None:
        self.inner = inner
        self.log = log
        self.pattern = inner.pattern
        self.wants_tensors = inner.wants_tensors

    @property
    def version(self) -> int:
        return self.inner.version

    async def publish(self, update: WeightUpdate, *, version: int,
                      ready_at: float | None = None) -> PublicationRecord:
        rec = await self.inner.publish(update, version=version, ready_at=ready_at)
        self.log.append(f"published {version}")
        return rec

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _train(config: TrainConfig, out: Path, trainer: FakeTrainer, log: list[str],
                 sink: Sink | None = None,
                 remembered: list[tuple[str, int]] | None = None,
                 adapters: list[tuple[str, str, int]] | None = None) -> TrainResult:
    _, clients = make_fake_fleet(2, responder=_model(log))
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake",
                           remember_weights=None if remembered is None else
                           lambda path, v: remembered.append((path, v)),
                           remember_adapter=None if adapters is None else
                           lambda name, path, v: adapters.append((name, path, v)))

    def make_publisher(plane: InferencePlane, gate: AdmissionGate) -> Publisher:
        inner = CheckpointPublisher(list(plane.clients.values()), None, gate=gate, plan="finish")  # type: ignore[arg-type]
        return LoggingPublisher(inner, log)

    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        result = await train_with(config, tasks=[make_task()], inference=plane,
                                  sandboxes=sandboxes, out_dir=out, trainer=trainer,
                                  make_publisher=make_publisher,
                                  extra_sinks=[sink] if sink else [])
    assert [c.policy_version for c in clients] == [result.summary["served_version"]] * 2
    return result


async def test_sync_collects_trains_saves_publishes_in_order(tmp_path: Path) -> None:
    log: list[str] = []
    trainer = FakeTrainer(log)
    sink = Sink(log)
    result = await _train(_config("sync", 3), tmp_path / "run", trainer, log, sink)
    marks = [e for e in log if not e.startswith("gen")]
    assert marks == ["ready 0", "train 1", "save 1", "published 1",
                     "ready 1", "train 2", "save 2", "published 2",
                     "ready 2", "train 3", "save 3", "published 3"]
    # no token between a hand-off and the publication that follows it
    for k in range(3):
        a, b = log.index(f"ready {k}"), log.index(f"published {k + 1}")
        assert not [e for e in log[a:b] if e.startswith("gen")]
    steps = result.summary["steps"]
    assert [list(s["versions"]) for s in steps] == [["0"], ["1"], ["2"]]
    assert all(n > 0 for s in steps for n in s["versions"].values())
    assert [s["policy_age"] for s in steps] == [0, 0, 0]
    assert [s["version"] for s in steps] == [1, 2, 3]
    assert all(s["publication_s"] is not None and s["apply_pause_s"] >= 0 for s in steps)
    lines = [json.loads(x) for x in (tmp_path / "run" / "train.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in lines] == ["publication", "step"] * 3
    assert {r["loss"] for r in lines if r["kind"] == "step"} == {0.5, 1.0, 1.5}
    assert sorted(p.name for p in (tmp_path / "run" / "weights").iterdir()) == [
        "v000001", "v000002", "v000003"]


async def test_a_restarted_server_is_told_the_served_checkpoint(tmp_path: Path) -> None:
    """Regression: managed servers re-apply remembered weights when they restart a dead
    engine, but the loop never told them, so a restarted engine served the initial weights
    (seen in `bench learning --engine vllm`: version 0 after 21 publications)."""
    remembered: list[tuple[str, int]] = []
    await _train(_config("sync", 2), tmp_path / "run", FakeTrainer([]), [], None, remembered)
    weights = tmp_path / "run" / "weights"
    assert remembered == [(str(weights / "v000001"), 1), (str(weights / "v000002"), 2)]


async def test_a_restarted_server_is_told_the_served_adapter(tmp_path: Path) -> None:
    """Regression (#10): with LoRA fine-tuning nothing was remembered, so a restarted engine
    lacked the adapter its client's requests name. The served adapter, under the name the
    lora pattern published it as, is now remembered like a full checkpoint."""
    remembered: list[tuple[str, int]] = []
    adapters: list[tuple[str, str, int]] = []
    lora: dict[str, Any] = {"trainer.finetune": "lora", "loop.publisher": "lora",
                            "loop.inflight": "finish"}
    config = _config("sync", 2, **lora)
    await _train(config, tmp_path / "run", FakeTrainer([]), [], None, remembered, adapters)
    weights = tmp_path / "run" / "weights"
    assert remembered == []
    assert adapters == [("policy-v1", str(weights / "v000001"), 1),
                        ("policy-v2", str(weights / "v000002"), 2)]


async def test_async_remembers_a_version_once_it_is_both_published_and_saved(
        tmp_path: Path) -> None:
    gate = AdmissionGate()
    remembered: list[tuple[str, int]] = []
    pub = FakePublisher(gate, tensors=True)
    loop = TrainingLoop(LoopSettings(mode="async", steps=2, max_lag=1), FakeTrainer([]), pub,
                        gate=gate, servers=["a"], weights_root=tmp_path,
                        load=lambda _p: _tensors([0]),
                        remember=lambda path, v: remembered.append((path, v)))
    await loop.on_batch(_Batch(0), tmp_path / "b0")  # type: ignore[arg-type]
    await loop.finish()
    assert remembered == [(str(tmp_path / "v000001"), 1)]


async def test_async_generates_during_training_within_the_lag(tmp_path: Path) -> None:
    log: list[str] = []
    sink = Sink(log)
    # step 1 returns only once batch 1 was collected (on version 0, while step 1 trained)
    trainer = FakeTrainer(log, hold={1: sink.event(1)})
    result = await _train(_config("async", 3, max_lag=1), tmp_path / "run", trainer, log, sink)
    steps = result.summary["steps"]
    assert [s["batch_index"] for s in steps] == [0, 1, 2] and not result.summary["stale"]
    assert [s["policy_age"] for s in steps] == [0, 1, 1]
    assert [sorted(s["versions"]) for s in steps][:2] == [["0"], ["0"]]
    assert log.index("ready 1") < log.index("train 1")  # generation overlapped step 1
    # batch 2 would be 2 versions old: no token until version 1 is served
    a, b = log.index("ready 1"), log.index("published 1")
    assert not [e for e in log[a:b] if e.startswith("gen")]
    assert result.summary["final_version"] == result.summary["served_version"] == 3


async def test_async_generation_overlaps_training_within_the_lag(tmp_path: Path) -> None:
    log: list[str] = []
    sink = Sink(log)
    trainer = FakeTrainer(log, hold={1: sink.event(1), 2: sink.event(2)})
    config = _config("async", 3, max_lag=2, **{"collect.metrics.prometheus_port": 0})
    result = await _train(config, tmp_path / "run", trainer, log, sink)
    steps = result.summary["steps"]
    assert [s["batch_index"] for s in steps] == [0, 1, 2] and not result.summary["stale"]
    assert all(s["policy_age"] <= 2 for s in steps)
    assert max(s["policy_age"] for s in steps) >= 1
    assert [s["version"] for s in steps] == [1, 2, 3]


async def test_async_collects_up_to_max_lag_batches_ahead_of_a_slow_trainer(
        tmp_path: Path) -> None:
    """Regression: the driver handed over at most one batch while the consumer was busy, so
    with a trainer slower than collection the collector stopped ~3 batches ahead and
    ``loop.max_lag`` above that bounded nothing (the real loop never reached a policy age
    above 3 with ``max_lag = 8``; the engines idled while the trainer trained). Now
    collection goes on until the admission gate closes at ``max_lag``."""
    log: list[str] = []
    sink = Sink(log)
    # step 1 returns only once batch 4 was collected: four batches on version 0, ahead of it
    trainer = FakeTrainer(log, hold={1: sink.event(4)})
    result = await _train(_config("async", 5, max_lag=4), tmp_path / "run", trainer, log, sink)
    steps = result.summary["steps"]
    assert [s["batch_index"] for s in steps] == [0, 1, 2, 3, 4] and not result.summary["stale"]
    assert [s["policy_age"] for s in steps] == [0, 1, 2, 3, 4]
    assert log.index("ready 4") < log.index("train 1")


# ---------------------------------------------------------------- the loop alone
class FakeRouter:
    def __init__(self) -> None:
        self.versions: list[tuple[str, int]] = []

    def on_weight_version(self, server: str, version: int) -> None:
        self.versions.append((server, version))


class FakePublisher:
    def __init__(self, gate: AdmissionGate, fail: bool = False, tensors: bool = False,
                 log: list[str] | None = None) -> None:
        self.gate = gate
        self.fail = fail
        self.wants_tensors = tensors
        self.pattern: Pattern = "direct" if tensors else "checkpoint"
        self.version = 0
        self.log = log if log is not None else []
        self.seen_gate: list[bool] = []
        self.got: list[WeightUpdate] = []

    async def publish(self, update: WeightUpdate, *, version: int,
                      ready_at: float | None = None) -> PublicationRecord:
        self.seen_gate.append(self.gate.is_open)
        self.got.append(update)
        self.log.append(f"published {version}")
        if self.fail:
            raise RuntimeError("engine died")
        self.version = version
        return PublicationRecord(self.pattern, version, version - 1, "finish", ready_at=0.0,
                                 paused_at=0.0, resumed_at=0.01, serving_at=0.01)

    async def aclose(self) -> None:
        return None


def _tensors(versions: list[int]) -> TensorBatch:
    n = len(versions)
    return TensorBatch(
        input_ids=torch.ones(1, n + 1, dtype=torch.int64),
        attention_mask=torch.ones(1, n + 1, dtype=torch.int64),
        loss_mask=torch.tensor([[0.0] + [1.0] * n]),
        old_logprobs=torch.zeros(1, n + 1),
        policy_versions=torch.tensor([[-1, *versions]], dtype=torch.int32),
        advantages=torch.zeros(1), rewards=torch.ones(1), prompt_lens=torch.ones(1, dtype=torch.int64),
        group_index=torch.zeros(1, dtype=torch.int64), trajectory_ids=("t",),
    )


class _Batch:
    def __init__(self, index: int) -> None:
        self.index = index
        self.staleness = None  # the gate did not run in collection


def test_batch_versions_counts_model_tokens_only() -> None:
    assert batch_versions(_tensors([0, 0, 1])) == {0: 2, 1: 1}


async def test_router_forgets_affinity_on_every_version_change(tmp_path: Path) -> None:
    gate = AdmissionGate()
    router = FakeRouter()
    pub = FakePublisher(gate)
    loop = TrainingLoop(LoopSettings(mode="sync", steps=2), FakeTrainer([]), pub, gate=gate,
                        servers=["a", "b"], weights_root=tmp_path, router=router,  # type: ignore[arg-type]
                        load=lambda _p: _tensors([0, 0]))
    for k in range(2):
        loop.emit(BatchEvent(kind=EventKind.BATCH_READY, t=0.0, batch_index=k, groups=1,
                             trajectories=1, window_start=0.0))
        assert not gate.is_open
        await loop.on_batch(_Batch(k), tmp_path / f"b{k}")  # type: ignore[arg-type]
        assert gate.is_open
    assert router.versions == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert pub.seen_gate == [False, False]  # published while admission was closed


async def test_sync_keeps_admission_closed_while_a_later_batch_waits(tmp_path: Path) -> None:
    gate = AdmissionGate()
    loop = TrainingLoop(LoopSettings(mode="sync", steps=2), FakeTrainer([]), FakePublisher(gate),
                        gate=gate, servers=["a"], weights_root=tmp_path,
                        load=lambda _p: _tensors([0]))
    for k in range(2):  # batch 1 completes (from attempts already generated) during step 1
        loop.emit(BatchEvent(kind=EventKind.BATCH_READY, t=0.0, batch_index=k, groups=1,
                             trajectories=1, window_start=0.0))
    await loop.on_batch(_Batch(0), tmp_path / "b0")  # type: ignore[arg-type]
    assert not gate.is_open  # batch 1 is trained on before any new token
    await loop.on_batch(_Batch(1), tmp_path / "b1")  # type: ignore[arg-type]
    assert gate.is_open


async def test_async_drops_a_batch_older_than_max_lag(tmp_path: Path) -> None:
    gate = AdmissionGate()
    ages = iter([[0], [0, 1], [0, 2]])  # the last: a straggler's v0 tokens at trainer v2
    trainer = FakeTrainer([])
    loop = TrainingLoop(LoopSettings(mode="async", steps=3, max_lag=1), trainer,
                        FakePublisher(gate), gate=gate, servers=["a"], weights_root=tmp_path,
                        load=lambda _p: _tensors(next(ages)))
    for k in range(3):
        loop.emit(BatchEvent(kind=EventKind.BATCH_READY, t=0.0, batch_index=k, groups=1,
                             trajectories=1, window_start=0.0))
        await loop.on_batch(_Batch(k), tmp_path / f"b{k}")  # type: ignore[arg-type]
    await loop.finish()
    assert [s["policy_age"] for s in loop.steps] == [0, 1]
    assert [(s["batch_index"], s["policy_age"]) for s in loop.stale] == [(2, 2)]
    assert len(trainer.trained) == 2 and loop.version == loop.published == 2


def test_async_admission_follows_the_expected_age(tmp_path: Path) -> None:
    gate = AdmissionGate()
    loop = TrainingLoop(LoopSettings(mode="async", steps=3, max_lag=1), FakeTrainer([]),
                        FakePublisher(gate), gate=gate, servers=["a"], weights_root=tmp_path)
    for k in range(2):
        loop.emit(BatchEvent(kind=EventKind.BATCH_READY, t=0.0, batch_index=k, groups=1,
                             trajectories=1, window_start=0.0))
        assert loop.expected_age() == k + 1 and gate.is_open == (k == 0)


async def test_a_tensor_publisher_gets_tensors_and_the_checkpoint_follows(tmp_path: Path) -> None:
    gate = AdmissionGate()
    log: list[str] = []
    pub = FakePublisher(gate, tensors=True, log=log)
    loop = TrainingLoop(LoopSettings(mode="sync", steps=1), FakeTrainer(log), pub, gate=gate,
                        servers=["a"], weights_root=tmp_path, load=lambda _p: _tensors([0]))
    await loop.on_batch(_Batch(0), tmp_path / "b0")  # type: ignore[arg-type]
    assert log == ["train 1", "tensors 1", "published 1", "save 1"]
    (got,) = pub.got
    assert got.tensors is not None and got.tensors["w"].tolist() == [1.0, 1.0]
    assert loop.steps[0]["weights"] == str(tmp_path / "v000001")


async def test_failed_sync_publication_reopens_admission_and_raises(tmp_path: Path) -> None:
    gate = AdmissionGate()
    router = FakeRouter()
    loop = TrainingLoop(LoopSettings(mode="sync", steps=1), FakeTrainer([]),
                        FakePublisher(gate, fail=True), gate=gate, servers=["a"],
                        weights_root=tmp_path, router=router,  # type: ignore[arg-type]
                        load=lambda _p: _tensors([0]))
    loop.emit(BatchEvent(kind=EventKind.BATCH_READY, t=0.0, batch_index=0, groups=1,
                             trajectories=1, window_start=0.0))
    with pytest.raises(RuntimeError, match="engine died"):
        await loop.on_batch(_Batch(0), tmp_path / "b0")  # type: ignore[arg-type]
    assert gate.is_open and router.versions == [] and loop.published == 0


async def test_failed_async_publication_surfaces_at_the_next_wait(tmp_path: Path) -> None:
    gate = AdmissionGate()
    loop = TrainingLoop(LoopSettings(mode="async", steps=2, max_lag=1), FakeTrainer([]),
                        FakePublisher(gate, fail=True), gate=gate, servers=["a"],
                        weights_root=tmp_path, load=lambda _p: _tensors([0]))
    await loop.on_batch(_Batch(0), tmp_path / "b0")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="engine died"):
        await loop.on_batch(_Batch(1), tmp_path / "b1")  # type: ignore[arg-type]
    assert loop.version == 1 and loop.published == 0


def test_config_rejects_mismatched_models_and_lora_checkpoint() -> None:
    from rollbank.errors import ConfigError

    with pytest.raises(ConfigError, match="same model"):
        load_train_config(None, {"trainer.model": "gemma-3-270m"})
    with pytest.raises(ConfigError, match="LoRA policy"):
        load_train_config(None, {"trainer.finetune": "lora"})
    with pytest.raises(ConfigError, match="temperature"):
        load_train_config(None, {"trainer.temperature": 1.0})
    with pytest.raises(ConfigError, match="max_lag"):
        load_train_config(None, {"loop.mode": "async", "loop.max_lag": 0})
    c = load_train_config(None, {"loop.steps": 5})
    assert c.collect.scheduler.num_batches == 5 and c.loop.pause_mode == "wait"


def test_cli_overrides_build_a_valid_config() -> None:
    from rollbank.cli.main import build_parser
    from rollbank.cli.train import overrides

    args = build_parser().parse_args([
        "train", "--mode", "async", "--max-lag", "2", "--inflight", "abort", "--steps", "3",
        "--model", "gemma-3-270m", "--groups", "3", "--group-size", "2", "--out", "x",
        "--set", "trainer.lr=0.001"])
    c = load_train_config(None, overrides(args))
    assert (c.loop.mode, c.loop.max_lag, c.loop.pause_mode, c.loop.steps) == ("async", 2, "abort", 3)
    assert c.trainer.model == c.collect.inference.managed.model == "gemma-3-270m"
    assert c.collect.scheduler.num_batches == 3 and c.collect.scheduler.groups_per_batch == 3
    assert c.collect.scheduler.bank.group_size == 2 and c.collect.output == "x"
    assert c.trainer.lr == 0.001
    pause = load_train_config(None, {"loop.inflight": "pause"})
    assert pause.loop.pause_mode == "keep"


def test_train_gauges_follow_the_records() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from rollbank.training.loop_metrics import TrainGauges

    reg = CollectorRegistry()
    g = TrainGauges(reg)
    g({"kind": "step", "version": 3, "reward_mean": 0.25, "loss": -0.5, "clip_fraction": 0.1,
       "policy_age": 1, "step_s": 2.0})
    g({"kind": "publication", "version": 3, "publication_s": 0.4, "apply_pause_s": 0.2})
    g({"kind": "stale", "policy_age": 2})
    text = generate_latest(reg).decode()
    for line in ("rollbank_train_version 3.0", "rollbank_train_served_version 3.0",
                 "rollbank_train_reward_mean 0.25", "rollbank_train_loss -0.5",
                 "rollbank_train_policy_age 2.0", "rollbank_publication_apply_pause_seconds 0.2",
                 "rollbank_train_stale_batches_total 1.0"):
        assert line in text
