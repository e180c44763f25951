"""``loop.publisher``: the config choice, the adapter over the publishing seam, per-version
cache salts on the wire, and what each pattern does inside the pause (fake servers)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollbank.errors import ConfigError, PublicationError
from rollbank.inference.protocol import AdmissionGate, GenerateRequest, PauseMode, SamplingParams
from rollbank.inference.publishing import WeightUpdate
from rollbank.inference.vllm_client import VLLMClient
from rollbank.training.loop_config import load_train_config
from rollbank.training.loop_publish import build_publisher

torch = pytest.importorskip("torch")


class Server:
    """A fake server with the control plane the checkpoint and lora patterns drive."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.version = 0
        self.model: str | None = None  # the adapter the client's requests name
        self.salt_by_version = False
        self.paused = False

    @property
    def base_url(self) -> str:
        return "s0"

    def set_admission(self, gate: AdmissionGate) -> None:
        self.gate = gate

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None:
        self.log.append(f"pause-{mode}")
        self.paused = True

    async def resume(self) -> None:
        self.log.append(f"resume(model={self.model})")
        self.paused = False

    async def reset_prefix_cache(self, *, attempts: int = 20, reset_running_requests: bool = False) -> None:
        self.log.append("reset-running" if reset_running_requests else "reset")

    async def engine_version(self, request_id: str | None = None) -> int:
        return self.version

    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        self.log.append(f"reload-{Path(weights_path).name}")
        self.version = version

    async def load_lora(self, name: str, path: str) -> None:
        self.log.append(f"load-{name}")

    async def unload_lora(self, name: str) -> None:
        self.log.append(f"unload-{name}")

    async def set_weight_version(self, version: int) -> None:
        self.log.append("label")
        self.version = version


def _model_dir(tmp_path: Path) -> Path:
    from safetensors.torch import save_file

    d = tmp_path / "model"
    d.mkdir()
    save_file({"w": torch.zeros(2, 2)}, str(d / "model.safetensors"))
    return d


def test_each_pattern_is_a_config_choice() -> None:
    c = load_train_config(None, {"loop.publisher": "direct"})
    assert c.collect.inference.managed.weight_transfer_backend == "rollbank_shm"  # set for it
    lora = load_train_config(None, {"loop.publisher": "lora", "trainer.finetune": "lora"})
    managed = lora.collect.inference.managed
    assert managed.enable_lora and managed.max_lora_rank >= lora.trainer.lora.rank
    assert load_train_config(None, {"loop.publisher": "colocated"}).loop.inflight == "pause"
    with pytest.raises(ConfigError, match=r"trainer\.finetune = 'lora'"):
        load_train_config(None, {"loop.publisher": "lora"})
    with pytest.raises(ConfigError, match=r"loop\.publisher = 'lora'"):
        load_train_config(None, {"trainer.finetune": "lora"})
    with pytest.raises(ConfigError, match="adapter switch"):
        load_train_config(None, {"loop.publisher": "lora", "trainer.finetune": "lora",
                                 "loop.inflight": "pause"})
    with pytest.raises(ConfigError, match="rollbank_shm"):
        load_train_config(None, {"loop.publisher": "direct",
                                 "collect.inference.managed.weight_transfer_backend": "nccl"})
    # async + pause + checkpoint is accepted now (salted requests, no refused reset)
    ok = load_train_config(None, {"loop.mode": "async", "loop.inflight": "pause"})
    assert ok.loop.cache_salt and ok.loop.pause_mode == "keep"


@pytest.mark.parametrize("salt", [True, False])
async def test_checkpoint_pause_skips_the_reset_only_when_requests_are_salted(
        tmp_path: Path, salt: bool) -> None:
    log: list[str] = []
    server = Server(log)
    config = load_train_config(None, {"loop.mode": "async", "loop.inflight": "pause",
                                      "loop.cache_salt": salt})
    pub = build_publisher(config, [server], AdmissionGate(), _model_dir(tmp_path))  # type: ignore[list-item]
    assert server.salt_by_version is salt  # every request carries its version's salt
    ckpt = tmp_path / "v000001"
    ckpt.mkdir()
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2, 2)}, str(ckpt / "model.safetensors"))
    pubn = await pub.publish(WeightUpdate(path=str(ckpt)), version=1)
    # frozen requests hold blocks: unsalted, the reset must preempt them; salted, none is needed
    middle = [] if salt else ["reset-running"]
    assert log == ["pause-keep", "reload-v000001", *middle, "resume(model=None)"]
    assert pubn.version == 1 and server.version == 1
    assert pubn.steps_s["cache_reset_skipped"] == float(salt)
    assert not pub.wants_tensors  # the loop hands it the saved directory
    with pytest.raises(PublicationError, match="checkpoint root"):
        await pub.publish(WeightUpdate(tensors={"w": torch.ones(2, 2)}), version=2)


async def test_lora_switches_the_requests_adapter_inside_the_pause(tmp_path: Path) -> None:
    log: list[str] = []
    server = Server(log)
    config = load_train_config(None, {"loop.publisher": "lora", "trainer.finetune": "lora",
                                      "trainer.lora.rank": 8})
    pub = build_publisher(config, [server], AdmissionGate(), _model_dir(tmp_path))  # type: ignore[list-item]
    assert pub.pattern == "lora" and not pub.wants_tensors
    adapter = tmp_path / "v000001"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    from safetensors.torch import save_file

    save_file({"a.lora_A.weight": torch.zeros(8, 2)}, str(adapter / "adapter_model.safetensors"))
    await pub.publish(WeightUpdate(path=str(adapter), lora=True), version=1)
    # loaded before the pause; the version named and the adapter switched before the resume;
    # no prefix-cache reset (the block hashes cover the adapter)
    assert log[:3] == ["load-policy-v1", "pause-wait", "label"]
    assert log[3] == "resume(model=policy-v1)" and server.version == 1


async def test_requests_carry_the_cache_salt_of_the_version_the_client_serves() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/update_weight_version":
            return httpx.Response(200, json={})
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"token_ids": [5], "logprobs": {
            "content": [{"logprob": -0.5}]}, "finish_reason": "length", "weight_versions": [
                {"weight_version": "0", "start": 0, "end": 1}]}]})

    client = VLLMClient("http://srv", transport=httpx.MockTransport(handler), scale_out=True,
                        salt_by_version=True)
    client._connected = True  # no /weight_info round trip: the test looks at the bodies only
    req = GenerateRequest("r1", [1, 2, 3], SamplingParams(max_tokens=1))
    for version in (0, 3):
        await client.set_weight_version(version)
        with contextlib.suppress(Exception):  # the answer's shape is not what this test checks
            await client.generate(req)
    assert [b.get("cache_salt") for b in bodies] == ["rollbank-weights-v0", "rollbank-weights-v3"]
    client.salt_by_version = False
    with contextlib.suppress(Exception):
        await client.generate(req)
    assert "cache_salt" not in bodies[-1]
    await client.aclose()
