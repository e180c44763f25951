"""Simple routing policies, the factory and block hashing (pure; FakeClock)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollbank.clock import FakeClock
from rollbank.errors import ConfigError
from rollbank.routing.blocks import BlockIndex, block_hashes
from rollbank.routing.cache_aware import CacheAwareRouter
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
