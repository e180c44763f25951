"""Unit tests for the in-memory fake inference server, client and tokenizer."""

from __future__ import annotations

import asyncio
import math

import pytest

from rollbank.errors import BadRequestError, EngineDeadError, ServerUnreachableError
from rollbank.inference.fake import (
    FakeInferenceClient,
    FakeInferenceServer,
    FakeTokenizer,
    make_fake_fleet,
)
from rollbank.inference.protocol import GenerateRequest, InferenceClient, SamplingParams


def req(rid: str, prompt: list[int], *, n: int = 8, temp: float = 1.0, **kw: object) -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_tokens=n, temperature=temp), **kw)  # type: ignore[arg-type]


def test_tokenizer_roundtrip() -> None:
    tok = FakeTokenizer()
    ids = tok.encode("héllo\n```bash\nls\n```")
    assert tok.decode(ids) == "héllo\n```bash\nls\n```"
    assert tok.decode([*ids, tok.EOS]) == tok.decode(ids)
    assert tok.eos_token_id == 257 and tok.bos_token_id == 256


async def test_client_satisfies_protocol_and_is_deterministic() -> None:
    client: InferenceClient = FakeInferenceClient(FakeInferenceServer(seed=3))
    prompt = list(range(40))
    a = await client.generate(req("a", prompt))
    b = await client.generate(req("a2", prompt))
    again = await FakeInferenceClient(FakeInferenceServer(seed=3)).generate(req("a", prompt))
    assert a.token_ids == again.token_ids and a.logprobs == again.logprobs
    assert a.token_ids != b.token_ids  # sampled: depends on the request id
    assert len(a.logprobs) == len(a.token_ids) == 8
    assert all(math.isfinite(x) and x <= 0 for x in a.logprobs)
    g1 = await client.generate(req("g1", prompt, temp=0.0))
    g2 = await client.generate(req("g2", prompt, temp=0.0))
    assert g1.token_ids == g2.token_ids  # greedy: does not depend on the request id
    assert a.finish_reason == "length" and a.prompt_tokens == 40


async def test_prefix_cache_hits_only_on_shared_full_blocks() -> None:
    server = FakeInferenceServer(block_size=4)
    client = FakeInferenceClient(server)
    first = await client.generate(req("1", list(range(10)), n=2))
    assert first.cached_prompt_tokens == 0
    # Extension of the first prompt: its two full blocks (8 tokens) are cached.
    second = await client.generate(req("2", [*range(10), 99, 98, 97], n=2))
    assert second.cached_prompt_tokens == 8
    # Same tail, different first token: the hash chain breaks at block 0.
    third = await client.generate(req("3", [7, *range(1, 10)], n=2))
    assert third.cached_prompt_tokens == 0
    m = await client.metrics()
    assert m.prefix_cache_queries == 10 + 13 + 10
    assert m.prefix_cache_hits == 8
    assert m.prefix_cache_hit_rate == pytest.approx(8 / 33)


async def test_lru_capacity_evicts_oldest() -> None:
    server = FakeInferenceServer(block_size=4, cache_capacity_blocks=2)
    client = FakeInferenceClient(server)
    await client.generate(req("a", [1] * 9, n=0))
    await client.generate(req("b", [2] * 9, n=0))  # evicts a's blocks
    assert server.cached_blocks == 2
    again = await client.generate(req("c", [1] * 9, n=0))
    assert again.cached_prompt_tokens == 0


async def test_reload_changes_outputs_and_restores_them() -> None:
    server = FakeInferenceServer()
    client = FakeInferenceClient(server)
    prompt = list(range(20))
    base = await client.generate(req("x", prompt, temp=0.0))
    await client.reload_weights("/ckpt/step-1", version=1)
    new = await client.generate(req("y", prompt, temp=0.0))
    assert client.policy_version == 1 and new.policy_version == 1
    assert new.token_ids != base.token_ids
    assert new.cached_prompt_tokens == 0  # reload cleared the cache
    await client.reload_weights("initial", version=2)
    back = await client.generate(req("z", prompt, temp=0.0))
    assert back.token_ids == base.token_ids and back.policy_version == 2


async def test_abort_returns_partial_output() -> None:
    server = FakeInferenceServer(decode_s_per_token=0.001)
    client = FakeInferenceClient(server)
    async with asyncio.TaskGroup() as tg:
        t = tg.create_task(client.generate(req("slow", [1, 2, 3], n=4000)))
        await server.wait_until(lambda s: s.running > 0 and s.counters.generation_tokens >= 3)
        await client.abort("slow")
    result = t.result()
    assert result.finish_reason == "abort"
    assert 3 <= len(result.token_ids) < 4000


async def test_pause_abort_wait_keep_and_resume() -> None:
    server = FakeInferenceServer(decode_s_per_token=0.001)
    client = FakeInferenceClient(server)
    async with asyncio.TaskGroup() as tg:
        t = tg.create_task(client.generate(req("a", [1, 2], n=4000)))
        await server.wait_until(lambda s: s.counters.generation_tokens >= 2)
        await client.pause("abort")
        assert await client.is_paused()
        # A request sent while paused waits for resume.
        late = tg.create_task(client.generate(req("late", [5, 6], n=3)))
        await asyncio.sleep(0.01)
        assert not late.done()
        await client.resume()
    assert t.result().finish_reason == "abort"
    assert late.result().finish_reason == "length" and len(late.result().token_ids) == 3

    async with asyncio.TaskGroup() as tg:
        w = tg.create_task(client.generate(req("w", [1, 2], n=20)))
        await server.wait_until(lambda s: s.running > 0)
        await client.pause("wait")  # drains: returns only when w is done
        assert w.done() and w.result().finish_reason == "length"
        await client.resume()

    before = server.counters.generation_tokens
    async with asyncio.TaskGroup() as tg:
        k = tg.create_task(client.generate(req("k", [1, 2], n=30)))
        await server.wait_until(lambda s: s.counters.generation_tokens >= before + 2)
        await client.pause("keep", clear_cache=False)
        frozen_at = server.counters.generation_tokens
        await asyncio.sleep(0.02)
        assert server.counters.generation_tokens == frozen_at and not k.done()
        await client.resume()
    assert len(k.result().token_ids) == 30


async def test_engine_death_and_restart() -> None:
    server = FakeInferenceServer(decode_s_per_token=0.001)
    client = FakeInferenceClient(server)
    with pytest.raises(ExceptionGroup) as info:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(client.generate(req("a", [1], n=4000)))
            await server.wait_until(lambda s: s.running > 0)
            server.kill()
            assert not await client.health()
    assert info.group_contains(EngineDeadError)
    with pytest.raises(EngineDeadError):
        await client.generate(req("b", [1], n=1))
    server.restart()
    assert await client.health()
    assert len((await client.generate(req("c", [1], n=2))).token_ids) == 2


async def test_bad_requests_and_unreachable() -> None:
    server = FakeInferenceServer(max_model_len=16)
    client = FakeInferenceClient(server)
    with pytest.raises(BadRequestError, match="max_model_len"):
        await client.generate(req("long", list(range(17)), n=1))
    clamped = await client.generate(req("clamp", list(range(10)), n=10))
    assert len(clamped.token_ids) == 6 and clamped.finish_reason == "length"
    with pytest.raises(BadRequestError, match="LoRA"):
        await client.generate(req("l", [1], n=1, lora="nope"))
    await client.load_lora("ad", "/tmp/ad")
    with_lora = await client.generate(req("l2", [1, 2], n=4, temp=0.0, lora="ad"))
    base = await client.generate(req("b2", [1, 2], n=4, temp=0.0))
    assert with_lora.token_ids != base.token_ids
    await client.unload_lora("ad")
    with pytest.raises(BadRequestError):
        await client.unload_lora("ad")
    client.unreachable = True
    with pytest.raises(ServerUnreachableError):
        await client.generate(req("u", [1], n=1))
    assert not await client.health()


async def test_scripted_responder_and_stop_strings() -> None:
    tok = FakeTokenizer()
    server = FakeInferenceServer(responder=lambda r: "```bash\nls\n```\nTask: next")
    client = FakeInferenceClient(server)
    r = await client.generate(
        GenerateRequest("s", tok.encode("Task: x\n"), SamplingParams(max_tokens=100, stop=("\nTask:",)))
    )
    assert r.finish_reason == "stop"
    assert r.text == "```bash\nls\n```"
    r2 = await client.generate(GenerateRequest("s2", [1], SamplingParams(max_tokens=100)))
    assert r2.finish_reason == "stop" and r2.token_ids[-1] == tok.EOS


async def test_max_running_queues_the_rest() -> None:
    servers, clients = make_fake_fleet(2, max_running=1, decode_s_per_token=0.001)
    assert [c.base_url for c in clients] == ["fake://server-0", "fake://server-1"]
    async with asyncio.TaskGroup() as tg:
        ts = [tg.create_task(clients[0].generate(req(f"r{i}", [1], n=5))) for i in range(3)]
        await servers[0].wait_until(lambda s: s.running > 0)
        m = await clients[0].metrics()
        assert m.running == 1 and m.waiting == 2
    assert all(t.result().timings.queue_s is not None for t in ts)
    assert max(t.result().timings.queue_s or 0.0 for t in ts) > 0


def test_block_hashes_chain_and_namespace() -> None:
    from rollbank.inference.prefix_cache import BlockPrefixCache, block_hashes

    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = block_hashes([1, 2, 3, 4, 5, 6, 7, 0], 4)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]
    assert block_hashes([1, 2, 3, 4], 4, namespace="v1") != block_hashes([1, 2, 3, 4], 4, namespace="v2")
    cache = BlockPrefixCache(block_size=4, capacity_blocks=8)
    cache.insert(list(range(12)), "w")
    assert cache.lookup(list(range(12)), "w") == 8  # the last prompt token is never counted
    assert cache.lookup(list(range(13)), "w") == 12
    assert cache.lookup(list(range(13)), "other") == 0


def test_a_full_prefix_cache_evicts_a_conversations_tail_first_as_vllm_does() -> None:
    """Regression (the emulated engine lost whole conversations under KV pressure): blocks were
    touched head first, so the LRU end of a conversation was its first block, and evicting it
    orphaned every later block. vLLM frees a request's blocks in reverse ("so that the tail
    blocks are evicted first", v1/core/single_type_kv_cache_manager.py): the prefix survives."""
    from rollbank.inference.prefix_cache import BlockPrefixCache

    cache = BlockPrefixCache(block_size=2, capacity_blocks=4)
    a = [1, 2, 3, 4, 5, 6, 7]  # 3 full blocks
    cache.insert(a)
    cache.insert([9, 9, 8, 8])  # 2 more blocks: one of a's goes
    assert cache.lookup(a) == 4  # its first two blocks still hit; only the tail was evicted
    cache.insert([7, 7])  # one more: the lookup made a recent, so the other one's tail goes
    assert cache.lookup([9, 9, 8, 8, 0]) == 2
    assert cache.lookup(a) == 4
