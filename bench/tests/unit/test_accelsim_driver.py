"""accelsim benchmark engine driver: the asyncio step loop (zero-latency profile, no HTTP)."""

from __future__ import annotations

import asyncio

import pytest

from rollbank_bench.accelsim.core import EngineCore, Step
from rollbank_bench.accelsim.driver import EngineDriver
from rollbank_bench.accelsim.profile import LatencyProfile


def zero_profile() -> LatencyProfile:
    return LatencyProfile(name="zero", source="test", kv_capacity_tokens=4096, vocab_size=100,
                          step_base_s=0.0, decode_per_seq_s=0.0, decode_per_ctx_token_s=0.0,
                          prefill_per_token_s=0.0)


class BrokenCore(EngineCore):
    def plan(self, now: float) -> Step | None:
        raise ValueError("boom")


async def test_generate_pause_keep_and_resume() -> None:
    d = EngineDriver(zero_profile())
    d.start()
    try:
        done = await d.generate(d.make_request("a", [1, 2, 3], max_tokens=4, temperature=0))
        assert done.finish_reason == "length" and len(done.output) == 4
        await d.pause("keep")
        held = asyncio.create_task(d.generate(d.make_request("b", [1, 2, 3], max_tokens=2)))
        await asyncio.sleep(0)
        assert not held.done() and d.paused
        d.set_version("5")
        d.resume()
        out = await held
        assert out.versions == ["5", "5"]
    finally:
        await d.stop()


async def test_a_core_failure_fails_requests_and_marks_the_engine_dead() -> None:
    d = EngineDriver(zero_profile())
    d.core = BrokenCore(zero_profile())
    d.start()
    try:
        with pytest.raises(RuntimeError, match="core died"):
            await d.generate(d.make_request("a", [1, 2], max_tokens=2))
        assert isinstance(d.dead, ValueError)
        with pytest.raises(RuntimeError, match="core died"):
            await d.generate(d.make_request("b", [1, 2], max_tokens=2))
    finally:
        await d.stop()
