"""rollbank's VLLMClient against a real accelsim benchmark engine process (HTTP, token ids)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollbank.errors import BadRequestError
from rollbank.inference.protocol import GenerateRequest, SamplingParams
from rollbank.inference.vllm_client import VLLMClient
from rollbank_bench.accelsim.process import AccelSimServers

pytestmark = pytest.mark.integration

PROFILE = """
source = "integration test profile (not a measurement)"
block_size = 16
kv_capacity_tokens = 4096
max_num_seqs = 8
max_num_batched_tokens = 512
max_model_len = 2048
vocab_size = 5000
eos_token_id = 4999
step_base_s = 0.01
decode_per_seq_s = 0.0
decode_per_ctx_token_s = 0.0
prefill_per_token_s = 0.00001
prefill_per_seq_s = 0.0
"""


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AccelSimServers]:
    prof = tmp_path / "itest.toml"
    prof.write_text(PROFILE)
    async with AccelSimServers(str(prof), log_dir=tmp_path) as servers:
        yield servers


def greq(rid: str, prompt: list[int], n: int = 8, temp: float = 0.0, lora: str | None = None) -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_tokens=n, min_tokens=n, temperature=temp), lora=lora)


async def test_tokens_logprobs_and_cached_prompt_tokens(engine: AccelSimServers) -> None:
    client = engine.clients[0]
    await client.connect()
    assert client.scale_out is True and client.policy_version == 0
    prompt = list(range(1, 101))  # 100 tokens: 6 full blocks of 16 hit on a repeat (99 looked up)
    first = await client.generate(greq("a", prompt))
    second = await client.generate(greq("b", prompt))
    assert len(first.token_ids) == 8 and all(0 <= t < 5000 for t in first.token_ids)
    assert first.token_ids == second.token_ids  # greedy: deterministic
    assert len(first.logprobs) == 8 and all(-6 <= lp < 0 for lp in first.logprobs)
    assert (first.cached_prompt_tokens, second.cached_prompt_tokens) == (0, 96)
    assert first.token_versions == [0] * 8 and first.finish_reason == "length"
    assert first.timings.first_token_s is not None and first.timings.first_token_s > 0
    m = await client.metrics()
    assert (m.prefix_cache_queries, m.prefix_cache_hits, m.generation_tokens) == (200, 96, 16)
    # the completions fallback gives the same greedy tokens and the usage's cached tokens
    legacy = VLLMClient(client.base_url, scale_out=False)
    try:
        third = await legacy.generate(greq("c", prompt))
    finally:
        await legacy.aclose()
    assert third.token_ids == first.token_ids and third.cached_prompt_tokens == 96
    await client.reset_prefix_cache()
    assert (await client.generate(greq("d", prompt))).cached_prompt_tokens == 0


async def test_abort_returns_partial_output(engine: AccelSimServers) -> None:
    client = engine.clients[0]
    task = asyncio.create_task(client.generate(greq("long", [7] * 20, n=1500)))
    for _ in range(1000):  # until a few tokens are out (the request takes ~15 s in all)
        if (await client.metrics()).generation_tokens >= 3:
            break
        await asyncio.sleep(0.02)
    await client.abort("long")
    result = await task
    assert result.finish_reason == "abort" and 3 <= len(result.token_ids) < 1500
    assert len(result.logprobs) == len(result.token_ids)


async def test_pause_keep_reload_resume_bumps_versions(engine: AccelSimServers) -> None:
    client = engine.clients[0]
    await client.connect()
    await client.pause("keep", clear_cache=False)
    assert await client.is_paused()
    task = asyncio.create_task(client.generate(greq("held", [3] * 10, n=4)))
    await asyncio.sleep(0.05)
    assert not task.done()  # new requests wait while paused
    await client.reload_weights("/weights/v3", version=3)
    await client.resume()
    result = await task
    assert not await client.is_paused()
    assert result.token_versions == [3, 3, 3, 3] and result.policy_version == 3
    assert await client.engine_version() == 3
    before = await client.generate(greq("x", [9] * 10))
    await client.reload_weights("/weights/v4", version=4)
    after = await client.generate(greq("y", [9] * 10))
    assert before.token_ids != after.token_ids  # new weights, new tokens


async def test_lora_names(engine: AccelSimServers) -> None:
    client = engine.clients[0]
    with pytest.raises(BadRequestError):
        await client.generate(greq("nolora", [1, 2, 3], lora="ad1"))
    await client.load_lora("ad1", "/adapters/ad1")
    with_lora = await client.generate(greq("lora", [1, 2, 3], lora="ad1"))
    base = await client.generate(greq("base", [1, 2, 3]))
    assert len(with_lora.token_ids) == 8 and with_lora.token_ids != base.token_ids
    await client.unload_lora("ad1")
