"""Simple routing policies, the factory and block hashing (pure; FakeClock)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollbank.clock import FakeClock
from rollbank.errors import ConfigError
from rollbank.routing.blocks import BlockIndex, block_hashes
from rollbank.routing.cache_aware import CacheAwareRouter
from rollbank.routing.config import RouterConfig
from rollbank.routing.factory import make_router
from rollbank.routing.policies import StickyRouter
from rollbank.routing.router import RouteRequest, RouterPolicy

SERVERS = ("a", "b", "c")


def req(rid: str, traj: str = "t0", group: str = "g0", prompt: list[int] | None = None) -> RouteRequest:
    return RouteRequest(rid, traj, group, prompt if prompt is not None else [1, 2, 3])


def test_round_robin_cycles_regardless_of_load() -> None:
    r = make_router("round_robin", SERVERS, FakeClock())
    assert [r.route(req(f"r{i}")) for i in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]
    assert r.in_flight() == {"a": 3, "b": 2, "c": 2}


def test_least_loaded_uses_real_in_flight_counts() -> None:
    r = make_router("least_loaded", SERVERS, FakeClock())
    first = [r.route(req(f"r{i}")) for i in range(3)]
    assert sorted(first) == ["a", "b", "c"]
    r.on_finish(first[1], "r1")
    assert r.route(req("r3")) == first[1]
    r.on_abort(first[2], "r2")
    r.on_finish(first[0], "r0")
    assert r.in_flight()[first[2]] == 0
    assert r.in_flight()[first[0]] == 0


def test_finish_of_unknown_or_duplicate_request_never_goes_negative() -> None:
    r = make_router("least_loaded", SERVERS, FakeClock())
    s = r.route(req("r0"))
    r.on_finish(s, "r0")
    r.on_finish(s, "r0")
    r.on_abort(s, "nope")
    other = next(x for x in SERVERS if x != s)
    r.on_finish(other, "r0")
    assert all(v == 0 for v in r.in_flight().values())


def test_sticky_pins_trajectory_and_forgets_pins_on_cache_reset() -> None:
    r = make_router("sticky", ("a", "b"), FakeClock())
    assert isinstance(r, StickyRouter)
    s0 = r.route(req("r0", traj="x"))
    s1 = r.route(req("r1", traj="y"))
    assert s0 != s1
    for i in range(5):
        assert r.route(req(f"x{i}", traj="x")) == s0
    r.on_cache_reset(s0)
    # after the reset "x" is placed afresh: on the least-loaded server, which is now s1
    assert r.route(req("x9", traj="x")) == s1


def test_factory_validates_config_and_names_the_field() -> None:
    r = make_router(RouterPolicy.CACHE_AWARE, SERVERS, FakeClock(), block_size=4)
    assert isinstance(r, CacheAwareRouter)
    assert r.config.block_size == 4
    with pytest.raises(ConfigError, match="block_sise"):
        make_router("cache_aware", SERVERS, FakeClock(), block_sise=4)
    with pytest.raises(ConfigError, match="policy"):
        make_router("fastest", SERVERS, FakeClock())
    with pytest.raises(ValueError, match="duplicate"):
        make_router("round_robin", ("a", "a"), FakeClock())


def test_unknown_server_in_event_is_an_error() -> None:
    r = make_router("cache_aware", SERVERS, FakeClock())
    with pytest.raises(KeyError):
        r.on_cache_reset("zzz")


def test_block_hashes_chain_and_ignore_partial_block() -> None:
    a = block_hashes(list(range(10)), 4)
    assert len(a) == 2
    b = block_hashes([*range(8), 99, 98, 97, 96], 4)
    assert b[:2] == a
    assert len(b) == 3
    # same block content after a different prefix hashes differently (chained)
    c = block_hashes([7, 7, 7, 7, 4, 5, 6, 7], 4)
    assert c[1] != a[1]
    assert block_hashes([1, 2, 3], 4) == []
    with pytest.raises(ValueError):
        block_hashes([1], 0)


def test_block_index_lru_capacity_and_age() -> None:
    idx = BlockIndex(max_blocks=3, max_age_s=10.0)
    idx.touch([1, 2], now=0.0)
    idx.touch([3], now=5.0)
    assert idx.match([1, 2, 3]) == 3
    idx.touch([1], now=6.0)  # 1 becomes most recent; 2 is now the oldest
    idx.touch([4], now=6.0)
    assert 2 not in idx
    assert idx.match([1, 2, 3]) == 1
    assert idx.expire(now=15.5) == 1  # block 3 (t=5) older than 10 s
    assert 3 not in idx
    assert len(idx) == 2


def test_a_full_block_index_forgets_a_conversations_tail_first_as_vllm_does() -> None:
    """vLLM frees a request's blocks tail first, so under pressure a server keeps a
    conversation's head; the router's belief must too (it believed the head gone, and
    routed the conversation's next turn away from the server holding its prefix)."""
    idx = BlockIndex(max_blocks=6, max_age_s=100.0)
    a, b = [11, 12, 13, 14], [21, 22, 23, 24]
    idx.touch(a, now=0.0)
    idx.touch(b, now=1.0)  # two of a's four blocks must go: its last two
    assert idx.match(a) == 2
    assert 11 in idx and 12 in idx and 13 not in idx and 14 not in idx
    assert idx.match(b) == 4


def test_the_router_still_believes_a_conversations_head_after_capacity_pressure() -> None:
    clock = FakeClock()
    cfg = RouterConfig(policy=RouterPolicy.CACHE_AWARE, block_size=4, max_blocks_per_server=12,
                       new_group_cache_threshold=0.0)
    router = CacheAwareRouter(["s0"], clock, cfg)
    first = list(range(32))  # 8 blocks
    router.route(RouteRequest(request_id="r0", trajectory_id="t0", group_id="g0",
                              prompt_token_ids=first))
    router.route(RouteRequest(request_id="r1", trajectory_id="t1", group_id="g1",
                              prompt_token_ids=list(range(100, 116))))  # 4 more: 12 in all
    router.route(RouteRequest(request_id="r2", trajectory_id="t2", group_id="g2",
                              prompt_token_ids=list(range(200, 208))))  # 2 over capacity
    assert router.believed_match("s0", first) == 6


class _ReferenceLru:
    """The LRU the index implements, one block at a time."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.order: list[int] = []

    def touch(self, hashes: list[int]) -> None:
        for h in reversed(hashes):
            if h in self.order:
                self.order.remove(h)
            self.order.append(h)
        del self.order[: max(0, len(self.order) - self.max_blocks)]


@settings(max_examples=300, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(0, 30), unique=True, max_size=8), max_size=20),
       max_blocks=st.integers(1, 12))
def test_block_index_keeps_exactly_the_reference_lru_order(prompts: list[list[int]],
                                                          max_blocks: int) -> None:
    idx, ref = BlockIndex(max_blocks=max_blocks, max_age_s=1e9), _ReferenceLru(max_blocks)
    for k, p in enumerate(prompts):
        idx.touch(p, now=float(k))
        ref.touch(p)
        # the same blocks after every touch: the eviction order shows in what later touches drop
        assert len(idx) == len(ref.order) and all(h in idx for h in ref.order)
        for q in prompts:
            expect = next((i for i, h in enumerate(q) if h not in ref.order), len(q))
            assert idx.match(q) == expect


_prompt_ops = st.lists(st.tuples(
    st.sampled_from(["s0", "s1", "s2"]),
    st.sampled_from(["extend", "edit", "truncate", "new"]),
    st.lists(st.integers(0, 5), max_size=12)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(ops=_prompt_ops, block_size=st.integers(1, 4), max_sessions=st.integers(1, 3),
       max_tokens=st.integers(0, 40))
def test_session_hashes_are_exactly_the_block_hashes_of_every_prompt(
        ops: list[tuple[str, str, list[int]]], block_size: int, max_sessions: int,
        max_tokens: int) -> None:
    """Incremental per session (an agent's prompt grows by turns), never different from
    hashing the whole prompt: edits, truncations, new prompts and evicted sessions included;
    the memo stays within its session and token bounds."""
    from rollbank.routing.blocks import SessionHashes

    memo = SessionHashes(block_size, max_sessions=max_sessions, max_tokens=max_tokens)
    prompts: dict[str, list[int]] = {}
    for session, op, tokens in ops:
        p = prompts.get(session, [])
        if op == "extend":
            p = p + tokens
        elif op == "edit" and p:
            p = [*p[: len(p) // 2], *tokens, *p[len(p) // 2 + 1:]]
        elif op == "truncate":
            p = p[: len(tokens)]
        else:
            p = list(tokens)
        prompts[session] = p
        assert memo.hashes(session, p) == block_hashes(p, block_size)
        assert len(memo) <= max_sessions and memo.tokens <= max_tokens
