"""The colocated pattern in the loop, over a fake in-process engine (the engine API
``ColocatedEngine`` steps: add_request / step / abort_request / collective_rpc / labels):

- the client: tokens tagged with the version in the engine at the step that made them (a
  request spanning a publication carries both), log-probs, aborts, scoring, refusals;
- ``rollbank train``'s loop with ``loop.publisher = colocated``: the trainer's tensors go to the
  same engine object the episodes generate with, between two of its steps, and the records are
  the same as the other patterns' (latency apart from the apply pause).
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from episode_rig import FileVerifier, fake_spec, make_task
from safetensors.torch import save_file
from test_training_loop import FakeTrainer

from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import SandboxPlane
from rollbank.errors import BadRequestError, ConfigError
from rollbank.inference.fake import FakeTokenizer
from rollbank.inference.protocol import AdmissionGate, GenerateRequest, SamplingParams
from rollbank.inference.publishing import (
    ColocatedEngine,
    ColocatedPublisher,
    Publisher,
    ServedWeights,
    WeightUpdate,
)
from rollbank.inference.publishing.colocated_client import ColocatedClient
from rollbank.inference_plane import InferencePlane
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool
from rollbank.training.loop_config import load_train_config
from rollbank.training.loop_publish import build_publisher
from rollbank.training.loop_run import train_with

TOK = FakeTokenizer()
DONE = TOK.encode("DONE\n")


@dataclass
class Logprob:
    logprob: float


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    text: str = ""
    finish_reason: str | None = None


@dataclass
class Out:
    request_id: str
    outputs: list[Completion]
    finished: bool = False
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    num_cached_tokens: int = 0


@dataclass
class Sampling:
    max_tokens: int = 5
    scoring: bool = False


@dataclass
class FakeLLMEngine:
    """One token per request per step: the DONE line's bytes, its log-prob = -(weight w)."""

    weights: dict[str, torch.Tensor] = field(default_factory=lambda: {"w": torch.zeros(2)})
    label: str = "default"
    requests: dict[str, tuple[list[int], Sampling, list[int]]] = field(default_factory=dict)
    lps: dict[str, list[Logprob]] = field(default_factory=dict)  # each token's, when sampled
    steps: int = 0
    permits: threading.Semaphore | None = None  # each step() takes one (None: no limit)

    @property
    def output_processor(self) -> Any:
        return type("P", (), {"request_states": dict(self.requests)})()

    def add_request(self, rid: str, prompt: dict[str, Any], sampling: Sampling) -> None:
        if len(prompt["prompt_token_ids"]) > 4000:
            raise ValueError("prompt longer than the context")
        self.requests[rid] = (prompt["prompt_token_ids"], sampling, [])

    def _lp(self) -> Logprob:
        return Logprob(-float(self.weights["w"][0]) - 0.5)

    def step(self) -> list[Out]:
        if self.permits is not None:
            assert self.permits.acquire(timeout=10), "the test never let this step run"
        self.steps += 1
        outs = []
        for rid, (prompt, sp, gen) in list(self.requests.items()):
            if sp.scoring:
                del self.requests[rid]
                outs.append(Out(rid, [Completion([1], None)], True,
                                [None] + [{t: self._lp()} for t in prompt[1:]]))
                continue
            gen.append(DONE[len(gen) % len(DONE)])
            lps = self.lps.setdefault(rid, [])
            lps.append(self._lp())
            done = len(gen) >= sp.max_tokens
            if done:
                del self.requests[rid]
            outs.append(Out(rid, [Completion(list(gen), [{t: lp} for t, lp in zip(gen, lps, strict=True)],
                                             TOK.decode(gen), "length" if done else None)], done))
        return outs

    def abort_request(self, ids: list[str]) -> None:
        for rid in ids:
            self.requests.pop(rid, None)

    def collective_rpc(self, method: str, kwargs: dict[str, Any]) -> None:
        assert method == "reload_weights"
        self.weights.update(dict(kwargs["weights_iterator"]))

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return True

    def set_weight_version(self, label: str) -> None:
        self.label = label

    def get_weight_version(self) -> str:
        return self.label


def _sampling(sp: SamplingParams | None) -> Sampling:
    return Sampling(scoring=True) if sp is None else Sampling(max_tokens=sp.max_tokens)


def _client(fake: FakeLLMEngine) -> ColocatedClient:
    return ColocatedClient(ColocatedEngine.over(fake), sampling=_sampling, idle_wait_s=0.005)


def _req(rid: str, n: int = 5) -> GenerateRequest:
    return GenerateRequest(rid, [1, 2, 3], SamplingParams(max_tokens=n))


async def _until(cond: Any) -> None:
    for _ in range(10_000):
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


def _tokens(fake: FakeLLMEngine, rid: str) -> int:
    entry = fake.requests.get(rid)
    return 0 if entry is None else len(entry[2])


async def test_tokens_carry_the_version_of_the_step_that_made_them() -> None:
    fake = FakeLLMEngine(permits=threading.Semaphore(0))
    client = _client(fake)
    eng = client.engine
    pub = ColocatedPublisher(eng, ServedWeights({"w": ((2,), "float32")}), plan="pause", stage=False)
    assert fake.permits is not None
    fake.permits.release(3)
    first = await client.generate(_req("a", 3))
    assert first.token_versions == [0, 0, 0] and first.logprobs == [-0.5] * 3
    assert first.finish_reason == "length" and first.text == "DON" and first.server == "colocated://0"
    # a request spanning a publication: 2 steps, then the publisher waits for the lock while
    # the stepping thread is inside its third step; the swap comes right after that step
    spanning = asyncio.create_task(client.generate(_req("b", 6)))
    fake.permits.release(2)
    await _until(lambda: _tokens(fake, "b") == 2 and fake.steps == 5)
    publishing = asyncio.create_task(
        pub.publish(WeightUpdate(tensors={"w": torch.full((2,), 2.0)}), version=1))
    await _until(eng._publisher_waiting.is_set)
    fake.permits.release(1)
    rec = await publishing
    fake.permits.release(100)
    res = await spanning
    assert res.token_versions == [0, 0, 0, 1, 1, 1]
    assert res.logprobs == [-0.5] * 3 + [-2.5] * 3  # the new weights from the swap on
    assert rec.pattern == "colocated" and rec.ok and rec.serving == {"colocated": 1}
    assert rec.publication_s >= rec.apply_pause_s >= 0 and client.policy_version == 1
    await client.aclose()


async def test_abort_returns_the_partial_tokens_and_refusals_are_typed() -> None:
    fake = FakeLLMEngine(permits=threading.Semaphore(0))
    client = _client(fake)
    assert fake.permits is not None
    task = asyncio.create_task(client.generate(_req("long", 50)))
    fake.permits.release(2)
    await _until(lambda: _tokens(fake, "long") == 2)
    await client.abort("long")
    fake.permits.release(1)  # the stepping thread aborts after the step it is in
    res = await task
    assert res.finish_reason == "abort" and res.token_ids == DONE[:3]
    assert res.token_versions == [0, 0, 0] and len(res.logprobs) == 3
    fake.permits = None
    with pytest.raises(BadRequestError, match="context"):
        await client.generate(GenerateRequest("big", list(range(5000)), SamplingParams(max_tokens=2)))
    with pytest.raises(BadRequestError, match="LoRA"):
        await client.generate(GenerateRequest("l", [1], SamplingParams(), lora="policy-v1"))
    assert await client.prompt_logprobs([5, 6, 7], request_id="s") == [0.0, -0.5, -0.5]
    assert client.inflight == 0 and await client.health()
    await client.aclose()


async def test_a_cancelled_generation_is_aborted_in_the_engine() -> None:
    fake = FakeLLMEngine(permits=threading.Semaphore(0))
    client = _client(fake)
    assert fake.permits is not None
    task = asyncio.create_task(client.generate(_req("gone", 1000)))
    fake.permits.release(1)
    await _until(lambda: _tokens(fake, "gone") == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    fake.permits.release(1)
    await _until(lambda: "gone" not in fake.requests)  # aborted by the stepping thread
    await client.aclose()


def _model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    save_file({"w": torch.zeros(2)}, str(d / "model.safetensors"))
    return d


def _train_config(steps: int, **extra: Any) -> Any:
    return load_train_config(None, {
        "loop.mode": "sync", "loop.steps": steps, "loop.publisher": "colocated",
        "collect.inference.calibrate": False, "collect.runner.max_model_len": 4096,
        "collect.inference.managed.max_model_len": 4096,
        "collect.metrics.live": "off", "collect.metrics.report": False,
        "collect.task_order_seed": None, "collect.include": [],
        "collect.scheduler.groups_per_batch": 1, "collect.scheduler.pool_groups": 1,
        "collect.scheduler.bank.group_size": 2, "collect.scheduler.sandbox_slots": 4,
        "collect.scheduler.inference_slots_per_server": 2, **extra,
    })


def test_the_config_takes_colocated_with_the_pause_plan_by_default() -> None:
    config = _train_config(1)
    assert config.loop.publisher == "colocated" and config.loop.inflight == "pause"
    assert _train_config(1, **{"loop.inflight": "abort"}).loop.inflight == "abort"
    with pytest.raises(ConfigError, match="'pause' or 'abort'"):
        _train_config(1, **{"loop.inflight": "finish"})
    with pytest.raises(ConfigError, match="kind = 'managed'"):
        _train_config(1, **{"collect.inference.kind": "fake"})
    with pytest.raises(ConfigError, match="LoRA policy"):
        _train_config(1, **{"trainer.finetune": "lora"})


def test_the_colocated_publisher_is_built_over_the_planes_engine(tmp_path: Path) -> None:
    client = _client(FakeLLMEngine())
    model = _model_dir(tmp_path)
    pub = build_publisher(_train_config(1), [client], AdmissionGate(), model)
    assert isinstance(pub, ColocatedPublisher) and pub.engine is client.engine and pub.wants_tensors
    with pytest.raises(ConfigError, match="in-process engine"):
        build_publisher(_train_config(1), [object()], AdmissionGate(), model)  # type: ignore[list-item]
    asyncio.run(client.aclose())


async def test_train_with_colocated_hands_the_trainers_tensors_to_the_engine_it_collects_with(
        tmp_path: Path) -> None:
    fake = FakeLLMEngine()
    client = _client(fake)
    plane = InferencePlane({client.base_url: client}, TOK, TOK.vocab_size, "colocated (fake engine)")
    made: list[ColocatedPublisher] = []

    def make_publisher(plane: InferencePlane, gate: AdmissionGate) -> Publisher:
        (c,) = plane.clients.values()
        assert isinstance(c, ColocatedClient)
        pub = ColocatedPublisher(c.engine, ServedWeights({"w": ((2,), "float32")}), plan="pause",
                                 stage=False)  # the staged reload needs vLLM's model: see the integration test
        made.append(pub)
        return pub

    trainer = FakeTrainer([])
    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        result = await train_with(_train_config(2), tasks=[make_task()], inference=plane,
                                  sandboxes=sandboxes, out_dir=tmp_path / "run", trainer=trainer,
                                  make_publisher=make_publisher)
    await client.aclose()
    steps = result.summary["steps"]
    assert [s["version"] for s in steps] == [1, 2]
    assert [list(s["versions"]) for s in steps] == [["0"], ["1"]]  # batch k on version k
    # the engine the episodes generated with got the trainer's last tensors, by the publisher
    assert torch.equal(fake.weights["w"], torch.full((2,), 2.0)) and client.policy_version == 2
    lines = [json.loads(x) for x in (tmp_path / "run" / "train.jsonl").read_text().splitlines()]
    pubs = [r for r in lines if r["kind"] == "publication"]
    assert [p["pattern"] for p in pubs] == ["colocated", "colocated"]
    for p in pubs:
        assert p["publication_s"] >= p["apply_pause_s"] >= 0
        assert p["detail"]["serving"] == {"colocated": p["version"]} and p["detail"]["ok"]
        assert {"diff_s", "apply_s", "wait_step_s"} <= set(p["detail"]["steps_s"])
    assert [r.version for r in made[0].records] == [1, 2]
    # the checkpoint is written after each publication (the record, off the critical path)
    assert sorted(p.name for p in (tmp_path / "run" / "weights").iterdir()) == ["v000001", "v000002"]
