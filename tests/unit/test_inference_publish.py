"""Unit tests for WeightPublisher over fake servers (order, versions, latencies, failures)."""

from __future__ import annotations

import asyncio

import pytest

from rollbank.clock import FakeClock
from rollbank.errors import BadRequestError
from rollbank.inference.fake import FakeInferenceClient, FakeInferenceServer, make_fake_fleet
from rollbank.inference.protocol import GenerateRequest, PauseMode, SamplingParams
from rollbank.inference.publish import AdmissionGate, WeightPublisher


class Recording(FakeInferenceClient):
    """Fake client that logs each control call into a shared list."""

    def __init__(self, server: FakeInferenceServer, log: list[str], fail_reload: bool = False) -> None:
        super().__init__(server)
        self.log = log
        self.fail_reload = fail_reload

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None:
        self.log.append(f"pause:{self.base_url}")
        await super().pause(mode, clear_cache=clear_cache)

    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        self.log.append(f"reload:{self.base_url}")
        if self.fail_reload:
            raise BadRequestError("no such checkpoint", server=self.base_url)
        await super().reload_weights(weights_path, version=version)

    async def reset_prefix_cache(self) -> None:
        self.log.append(f"reset:{self.base_url}")
        await super().reset_prefix_cache()

    async def resume(self) -> None:
        self.log.append(f"resume:{self.base_url}")
        await super().resume()


async def test_safe_order_and_version_bump() -> None:
    log: list[str] = []
    servers, _ = make_fake_fleet(2)
    clients = [Recording(s, log) for s in servers]
    published: list[tuple[str, int]] = []
    pub = WeightPublisher(clients, on_published=lambda p, v: published.append((p, v)))
    report = await pub.publish("/ckpt/1", version=1)
    steps = [entry.split(":")[0] for entry in log]
    assert steps == ["pause"] * 2 + ["reload"] * 2 + ["reset"] * 2 + ["resume"] * 2
    assert all(c.policy_version == 1 for c in clients)
    assert all(not s.is_paused and s.weights_path == "/ckpt/1" for s in servers)
    assert published == [("/ckpt/1", 1)]
    assert report.publication_s >= report.apply_pause_s >= 0
    assert set(report.step_s) == {"pause_s", "reload_s", "reset_s", "resume_s"}


async def test_inflight_requests_keep_old_version_and_gate_closes() -> None:
    server = FakeInferenceServer(decode_s_per_token=0.001)
    client = FakeInferenceClient(server)
    gate = AdmissionGate()
    pub = WeightPublisher([client], gate=gate, pause_mode="wait")
    seen_closed: list[bool] = []

    async def sender() -> None:
        await server.wait_until(lambda s: s.is_paused)
        seen_closed.append(not gate.is_open)
        await gate.wait_open()

    async with asyncio.TaskGroup() as tg:
        old = tg.create_task(client.generate(GenerateRequest("old", [1, 2], SamplingParams(max_tokens=50))))
        await server.wait_until(lambda s: s.running > 0)
        tg.create_task(sender())
        await pub.publish("/ckpt/2", version=2)
    new = await client.generate(GenerateRequest("new", [1, 2], SamplingParams(max_tokens=5)))
    assert old.result().policy_version == 0 and len(old.result().token_ids) == 50
    assert new.policy_version == 2
    assert seen_closed == [True] and gate.is_open


async def test_failed_reload_still_resumes_everyone() -> None:
    log: list[str] = []
    servers, _ = make_fake_fleet(2)
    clients = [Recording(servers[0], log), Recording(servers[1], log, fail_reload=True)]
    pub = WeightPublisher(clients)
    with pytest.raises(BadRequestError):
        await pub.publish("/ckpt/3", version=3)
    assert [c.policy_version for c in clients] == [3, 0]  # each reports what it really holds
    assert not servers[0].is_paused and not servers[1].is_paused
    assert pub.reports[-1].failed == ("fake://server-1",)
    assert pub.gate.is_open


async def test_publication_latency_counts_from_checkpoint_ready() -> None:
    clock = FakeClock(100.0)
    _, clients = make_fake_fleet(1)
    report = await WeightPublisher(clients, clock=clock).publish("/c", version=1, ready_at=90.0)
    assert report.publication_s == pytest.approx(10.0)
    assert report.apply_pause_s == pytest.approx(0.0)
