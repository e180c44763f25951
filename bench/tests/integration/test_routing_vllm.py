"""Integration: routing and token-exact conversations against two REAL vLLM servers (tiny).

Cache effects are read from the servers' own answers (``cached_tokens`` per request), so
these tests check that the router's beliefs match what vLLM actually holds, that a
conversation's prompts really extend each other token for token, and that token-id prompts
pass through the peer router (``vllm-router``) with a session header.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from rollbank.clock import MonotonicClock
from rollbank.episodes.conversation import Conversation
from rollbank.episodes.trajectory import ENV_VERSION, Trajectory
from rollbank.inference.config import ServerConfig
from rollbank.inference.models import load_tokenizer
from rollbank.inference.protocol import GenerateRequest, InferenceClient, SamplingParams
from rollbank.inference.server import ManagedServers
from rollbank.routing.cache_aware import CacheAwareRouter
from rollbank.routing.factory import make_router
from rollbank_bench.routing_peers import PeerRouter, find_vllm_router, peer_client
from rollbank_bench.routing_workload import (
    ArmResult,
    Workload,
    cacheable,
    fixed_dispatch,
    router_dispatch,
    run_arm,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.asyncio(loop_scope="module"),
]

BLOCK = 32


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ManagedServers]:
    cfg = ServerConfig.model_validate({
        "model": "tiny", "num_servers": 2, "kv_cache_gib": 1,
        "run_dir": tmp_path_factory.mktemp("vllm-routing"),
        "extra_args": ["--block-size", str(BLOCK)],
    })
    async with ManagedServers(cfg) as ms:
        yield ms


async def reset(fleet: ManagedServers) -> None:
    for c in fleet.clients:
        await c.reset_prefix_cache()


def clients_of(fleet: ManagedServers) -> dict[str, InferenceClient]:
    return dict(zip(fleet.urls, fleet.clients, strict=True))


def workload(groups: int, group_size: int, turns: int = 3) -> Workload:
    return Workload(
        groups=groups, group_size=group_size, turns=turns, header_tokens=64, task_tokens=128,
        obs_tokens=(40, 90), max_tokens=16, tool_pause_s=0.05, vocab=(16, 2048), seed=7,
    )


async def test_round_robin_repeats_prefill_that_cache_aware_avoids(fleet: ManagedServers) -> None:
    """One conversation: round-robin alternates servers, so every later turn re-prefills the
    context on a server that never saw it; cache-aware keeps it where its KV blocks are."""
    out = {}
    for policy in ("round_robin", "cache_aware"):
        await reset(fleet)
        router = make_router(policy, fleet.urls, MonotonicClock(), block_size=BLOCK)
        res = await run_arm(ArmResult(policy, "rollbank"), workload(1, 1, turns=4), fleet.urls,
                            *router_dispatch(router, clients_of(fleet)))
        assert res.error is None
        assert all(v == 0 for v in router.in_flight().values())
        out[policy] = res
    rr = out["round_robin"].summary(fleet.urls, BLOCK)
    ca = out["cache_aware"].summary(fleet.urls, BLOCK)
    assert len({r.server for r in out["round_robin"].records}) == 2
    assert len({r.server for r in out["cache_aware"].records}) == 1
    assert rr["repeated_prefill_tokens_full_blocks"] > 0
    assert ca["repeated_prefill_tokens_full_blocks"] == 0
    assert ca["uncached_prefill_tokens"] < rr["uncached_prefill_tokens"]


async def test_cache_aware_keeps_groups_together_and_spreads_groups(fleet: ManagedServers) -> None:
    await reset(fleet)
    router = make_router("cache_aware", fleet.urls, MonotonicClock(), block_size=BLOCK)
    assert isinstance(router, CacheAwareRouter)
    res = await run_arm(ArmResult("ca", "rollbank"), workload(4, 2), fleet.urls,
                        *router_dispatch(router, clients_of(fleet)))
    assert res.error is None
    by_group: dict[str, set[str | None]] = {}
    for r in res.records:
        by_group.setdefault(r.trajectory_id.split("s")[0], set()).add(r.server)
    assert all(len(s) == 1 for s in by_group.values())
    assert set().union(*by_group.values()) == set(fleet.urls)
    assert all(v == 0 for v in router.in_flight().values())
    # what the router believed matches what vLLM served from cache, turn after turn
    later = [r for r in res.records if r.turn > 0]
    assert later and all(
        (r.cached_tokens or 0) >= cacheable(r.seen_before, r.prompt_tokens, BLOCK) for r in later
    )


async def test_conversation_prompts_extend_token_for_token(fleet: ManagedServers) -> None:
    """Real tokenizer, real server: each turn's prompt is the last one plus the generated ids
    plus the observation ids, so the server serves the whole earlier context from cache."""
    assert fleet.model_dir is not None
    tok = load_tokenizer(fleet.model_dir)
    client = fleet.clients[0]
    await reset(fleet)
    conv = Conversation(tok, Trajectory("t", "g", "task", 0))
    conv.start("Task: count the lines of data.csv\n" * 8)
    sp = SamplingParams(max_tokens=24, temperature=1.0, stop=("\nOutput:",))
    previous: list[int] = []
    for turn in range(4):
        prompt = conv.prompt_token_ids
        assert prompt[: len(previous)] == previous
        res = await client.generate(GenerateRequest(f"conv-t{turn}", prompt, sp))
        if turn > 0:
            assert res.cached_prompt_tokens is not None
            assert res.cached_prompt_tokens >= cacheable(len(previous), len(prompt), BLOCK)
        conv.append_result(res)
        previous = conv.prompt_token_ids
        conv.append_observation(f"\nOutput:\n```\nline {turn}\n[exit code 0]\n```\n")
    t = conv.trajectory
    if tok.bos_token_id is not None:
        assert t.token_ids.count(tok.bos_token_id) == 1
    assert len(t.token_ids) == len(t.logprobs) == len(t.loss_mask) == len(t.policy_versions)
    assert all((m == 1) == (v != ENV_VERSION) for m, v in zip(t.loss_mask, t.policy_versions,
                                                                strict=True))
    assert t.num_model_tokens > 0


async def test_peer_router_routes_token_id_prompts_by_session(fleet: ManagedServers) -> None:
    binary = find_vllm_router()
    if binary is None:
        pytest.skip("vllm-router is not installed (pip install 'rollbank[peers]')")
    await reset(fleet)
    async with PeerRouter(binary, fleet.urls, "consistent_hash") as peer:
        client = peer_client(peer.url, "tiny", "trajectory")
        try:
            res = await run_arm(ArmResult("peer", "peer"), workload(2, 2), fleet.urls,
                                *fixed_dispatch(client))
        finally:
            await client.aclose()
    assert res.error is None
    assert len(res.records) == 2 * 2 * 3
    later = [r for r in res.records if r.turn > 0]
    # the session header pinned every conversation: earlier turns are always served from cache
    assert all(
        (r.cached_tokens or 0) >= cacheable(r.seen_before, r.prompt_tokens, BLOCK) for r in later
    )
