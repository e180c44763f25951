"""The checkpoint pattern of the one publication seam over the fake inference clients (what
serve-collector and the training loop drive): order, versions, latencies, failures.

(These were the tests of the earlier ``WeightPublisher``, which had no validation or rollback:
a failed reload left one engine on the new weights and one on the old.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rollbank.clock import FakeClock
from rollbank.errors import BadRequestError, PublicationError, WeightMismatchError
from rollbank.inference.fake import FakeInferenceClient, FakeInferenceServer, make_fake_fleet
from rollbank.inference.protocol import AdmissionGate, GenerateRequest, PauseMode, SamplingParams
from rollbank.inference.publishing import CheckpointPublisher, WeightUpdate


class Recording(FakeInferenceClient):
    """Fake client that logs each control call into a shared list."""

    def __init__(self, server: FakeInferenceServer, log: list[str], fail_reload: str | None = None) -> None:
        super().__init__(server)
        self.log = log
        self.fail_reload = fail_reload  # a checkpoint path this engine refuses

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None:
        self.log.append(f"pause:{self.base_url}")
        await super().pause(mode, clear_cache=clear_cache)

    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        self.log.append(f"reload:{self.base_url}:{Path(weights_path).name}")
        if weights_path == self.fail_reload:
            raise BadRequestError("no such checkpoint", server=self.base_url)
        await super().reload_weights(weights_path, version=version)

    async def reset_prefix_cache(self, *, attempts: int = 20, reset_running_requests: bool = False) -> None:
        self.log.append(f"reset:{self.base_url}")
        await super().reset_prefix_cache()

    async def resume(self) -> None:
        self.log.append(f"resume:{self.base_url}")
        await super().resume()


def _ckpt(root: Path, name: str, shape: tuple[int, ...] = (2, 2)) -> Path:
    d = root / name
    d.mkdir(parents=True)
    save_file({"w": torch.zeros(shape)}, str(d / "model.safetensors"))
    return d


async def test_safe_order_and_version_bump(tmp_path: Path) -> None:
    log: list[str] = []
    servers, _ = make_fake_fleet(2)
    clients = [Recording(s, log) for s in servers]
    pub = CheckpointPublisher(clients, _ckpt(tmp_path, "base"))
    v1 = _ckpt(tmp_path, "v1")
    rec = await pub.publish(WeightUpdate(path=str(v1)), version=1)
    steps = [entry.split(":")[0] for entry in log]
    assert steps == ["pause"] * 2 + ["reload"] * 2 + ["reset"] * 2 + ["resume"] * 2
    assert all(c.policy_version == 1 for c in clients)
    assert all(not s.is_paused and s.weights_path == str(v1) for s in servers)
    assert rec.ok and rec.serving == {c.base_url: 1 for c in clients} and pub.version == 1
    assert rec.publication_s >= rec.apply_pause_s >= 0
    assert {"pause_s", "apply_s", "reset_s", "resume_s"} <= set(rec.steps_s)


async def test_inflight_requests_keep_old_version_and_gate_closes(tmp_path: Path) -> None:
    server = FakeInferenceServer(decode_s_per_token=0.001)
    client = FakeInferenceClient(server)
    gate = AdmissionGate()
    pub = CheckpointPublisher([client], _ckpt(tmp_path, "base"), gate=gate, plan="finish")
    seen_closed: list[bool] = []

    async def sender() -> None:
        await server.wait_until(lambda s: s.is_paused)
        seen_closed.append(not gate.is_open)
        await gate.wait_open()

    async with asyncio.TaskGroup() as tg:
        old = tg.create_task(client.generate(GenerateRequest("old", [1, 2], SamplingParams(max_tokens=50))))
        await server.wait_until(lambda s: s.running > 0)
        tg.create_task(sender())
        await pub.publish(WeightUpdate(path=str(_ckpt(tmp_path, "v2"))), version=2)
    new = await client.generate(GenerateRequest("new", [1, 2], SamplingParams(max_tokens=5)))
    assert old.result().policy_version == 0 and len(old.result().token_ids) == 50
    assert new.policy_version == 2
    assert seen_closed == [True] and gate.is_open


async def test_failed_reload_rolls_every_engine_back(tmp_path: Path) -> None:
    log: list[str] = []
    servers, _ = make_fake_fleet(2)
    base = _ckpt(tmp_path, "base")
    v3 = _ckpt(tmp_path, "v3")
    clients = [Recording(servers[0], log), Recording(servers[1], log, fail_reload=str(v3))]
    pub = CheckpointPublisher(clients, base)
    with pytest.raises(PublicationError) as err:
        await pub.publish(WeightUpdate(path=str(v3)), version=3)
    # never mixed: the engine that took v3 reloaded the base checkpoint under version 0
    assert [c.policy_version for c in clients] == [0, 0]
    assert err.value.serving == {c.base_url: 0 for c in clients}
    assert f"reload:{clients[0].base_url}:base" in log
    assert not servers[0].is_paused and not servers[1].is_paused
    assert pub.fleet.gate.is_open and pub.version == 0


async def test_a_checkpoint_of_another_model_is_refused_before_any_pause(tmp_path: Path) -> None:
    log: list[str] = []
    servers, _ = make_fake_fleet(1)
    pub = CheckpointPublisher([Recording(servers[0], log)], _ckpt(tmp_path, "base"))
    with pytest.raises(WeightMismatchError, match="shape"):
        await pub.publish(WeightUpdate(path=str(_ckpt(tmp_path, "big", (3, 3)))), version=1)
    with pytest.raises(PublicationError, match="not a checkpoint"):
        await pub.publish(WeightUpdate(path=str(tmp_path / "missing")), version=1)
    assert log == []


async def test_without_a_model_folder_the_first_checkpoint_is_the_reference(tmp_path: Path) -> None:
    servers, clients = make_fake_fleet(1)
    pub = CheckpointPublisher(clients, None)
    await pub.publish(WeightUpdate(path=str(_ckpt(tmp_path, "v1"))), version=1)
    with pytest.raises(WeightMismatchError):
        await pub.publish(WeightUpdate(path=str(_ckpt(tmp_path, "v2", (3, 3)))), version=2)
    assert clients[0].policy_version == 1 and servers[0].weights_path == str(tmp_path / "v1")


async def test_publication_latency_counts_from_checkpoint_ready(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    _, clients = make_fake_fleet(1)
    pub = CheckpointPublisher(clients, _ckpt(tmp_path, "base"), clock=clock)
    rec = await pub.publish(WeightUpdate(path=str(_ckpt(tmp_path, "v1"))), version=1, ready_at=90.0)
    assert rec.publication_s == pytest.approx(10.0)
    assert rec.apply_pause_s == pytest.approx(0.0)
