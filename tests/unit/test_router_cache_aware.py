"""The cache-aware policy stepped with a FakeClock: affinity, imbalance, groups, resets."""

from __future__ import annotations

from rollbank.clock import FakeClock
from rollbank.routing.cache_aware import CacheAwareRouter, RouteReason
from rollbank.routing.factory import make_router
from rollbank.routing.router import RouteRequest

BS = 4


def make(clock: FakeClock, servers: tuple[str, ...] = ("a", "b"), **cfg: object) -> CacheAwareRouter:
    r = make_router("cache_aware", servers, clock, block_size=BS, **cfg)
    assert isinstance(r, CacheAwareRouter)
    return r


def why(r: CacheAwareRouter) -> RouteReason | None:
    """The last decision's reason (a call, so mypy does not narrow it across routes)."""
    return r.last_reason


def prompt(seed: int, n: int = 32) -> list[int]:
    return [seed * 1000 + i for i in range(n)]


def test_multi_turn_conversation_follows_its_prefix() -> None:
    clock = FakeClock()
    r = make(clock)
    p = prompt(1)
    s = r.route(RouteRequest("t0-0", "t0", "g0", p))
    assert why(r) is RouteReason.LOAD
    r.on_finish(s, "t0-0")
    # another conversation lands on the other server (less loaded on ties by rotation/load)
    other = r.route(RouteRequest("u0-0", "u0", "g1", prompt(2)))
    assert other != s
    for turn in range(1, 6):
        p = p + [7] * 9 + [8] * 5  # model tokens + observation tokens
        clock.advance(1.0)
        got = r.route(RouteRequest(f"t0-{turn}", "t0", "g0", p))
        assert got == s
        assert why(r) is RouteReason.PREFIX
        r.on_finish(got, f"t0-{turn}")


def test_grpo_siblings_are_placed_together_and_groups_spread() -> None:
    clock = FakeClock()
    r = make(clock)
    placed: dict[str, set[str]] = {}
    for g in range(4):
        for k in range(4):
            s = r.route(RouteRequest(f"g{g}-{k}", f"g{g}/{k}", f"g{g}", prompt(g)))
            placed.setdefault(f"g{g}", set()).add(s)
    assert all(len(v) == 1 for v in placed.values())
    assert r.in_flight() == {"a": 8, "b": 8}


def test_group_affinity_without_a_full_block() -> None:
    clock = FakeClock()
    r = make(clock, ("a", "b", "c"))
    s = r.route(RouteRequest("x0", "x", "g", [1, 2]))  # shorter than one block
    assert r.route(RouteRequest("y0", "y", "g", [1, 2])) == s
    assert why(r) is RouteReason.GROUP
    assert r.route(RouteRequest("x1", "x", "g", [1, 2, 5])) == s
    assert why(r) is RouteReason.TRAJECTORY


def test_affinity_broken_only_under_real_imbalance() -> None:
    clock = FakeClock()
    r = make(clock, balance_abs_threshold=3, balance_rel_threshold=1.5)
    shared = prompt(5)
    first = r.route(RouteRequest("r0", "t0", "g", shared))
    servers = [first]
    for i in range(1, 6):
        servers.append(r.route(RouteRequest(f"r{i}", f"t{i}", "g", shared)))
    # loads 4 vs 0 is within abs threshold 3? no: 4-0 > 3 -> the 5th breaks away
    assert servers[:4] == [first] * 4
    assert servers[4] != first
    assert why(r) is RouteReason.PREFIX  # the 6th follows the prefix, now on both
    assert r.stats()["reason_imbalance"] == 1
    assert servers[5] == servers[4]


def test_relative_threshold_needs_both_conditions() -> None:
    clock = FakeClock()
    r = make(clock, balance_abs_threshold=0, balance_rel_threshold=2.0)
    shared = prompt(5)
    a = r.route(RouteRequest("p0", "p0", "g", shared))
    b = r.route(RouteRequest("q0", "q0", "h", prompt(6)))
    assert a != b
    assert r.route(RouteRequest("p1", "p1", "g", shared)) == a  # 1 vs 1: balanced
    assert r.route(RouteRequest("p2", "p2", "g", shared)) == a  # 2 vs 1: 2 > 2*1 fails
    assert r.route(RouteRequest("p3", "p3", "g", shared)) == b  # 3 vs 1: both hold
    assert why(r) is RouteReason.IMBALANCE


def test_prefix_evicted_by_age() -> None:
    clock = FakeClock()
    r = make(clock, eviction_s=100.0)
    p = prompt(3)
    s = r.route(RouteRequest("r0", "t", "g", p))
    r.on_finish(s, "r0")
    assert r.believed_match(s, p) == len(p) // BS
    clock.advance(99.0)
    assert r.route(RouteRequest("r1", "u", "h", p)) == s
    assert why(r) is RouteReason.PREFIX
    r.on_finish(s, "r1")
    clock.advance(101.0)  # 101 s since the last touch
    r.route(RouteRequest("r2", "v", "k", p))
    assert why(r) is RouteReason.LOAD


def test_capacity_eviction_prefers_recently_used_prefixes() -> None:
    clock = FakeClock()
    r = make(clock, ("a",), max_blocks_per_server=10)
    old, new = prompt(1, 32), prompt(2, 32)  # 8 blocks each
    r.route(RouteRequest("r0", "t0", "g0", old))
    clock.advance(1)
    r.route(RouteRequest("r1", "t1", "g1", new))
    assert r.believed_match("a", new) == 8
    assert r.believed_match("a", old) == 2  # its last blocks went first: its head is kept, as vLLM keeps it


def test_cache_reset_and_weight_version_forget_beliefs() -> None:
    clock = FakeClock()
    r = make(clock)
    p = prompt(4)
    s = r.route(RouteRequest("r0", "t", "g", p))
    r.on_finish(s, "r0")
    r.on_cache_reset(s)
    assert r.believed_match(s, p) == 0
    s2 = r.route(RouteRequest("r1", "t", "g", p))
    assert why(r) is RouteReason.LOAD
    r.on_finish(s2, "r1")
    r.on_weight_version(s2, 0)  # first sighting: nothing to forget
    assert r.believed_match(s2, p) == len(p) // BS
    r.on_weight_version(s2, 0)
    assert r.believed_match(s2, p) == len(p) // BS
    r.on_weight_version(s2, 1)
    assert r.believed_match(s2, p) == 0
    r.route(RouteRequest("r2", "t", "g", p))
    assert why(r) is RouteReason.LOAD


def test_longest_prefix_wins_over_shorter_shared_prefix() -> None:
    clock = FakeClock()
    r = make(clock, cache_threshold=0.1, new_group_cache_threshold=0.1,
             balance_abs_threshold=0, balance_rel_threshold=1.0)
    header = prompt(9, 16)
    pa = header + prompt(1, 16)
    pb = header + prompt(2, 16)
    sa = r.route(RouteRequest("a0", "ta", "ga", pa))
    sb = r.route(RouteRequest("b0", "tb", "gb", pb))
    assert why(r) is RouteReason.IMBALANCE  # header pulls it to sa, load 1 vs 0 forbids
    assert sa != sb
    r.on_finish(sa, "a0")
    r.on_finish(sb, "b0")
    for i in range(3):
        assert r.route(RouteRequest(f"a{i + 1}", f"ta{i}", f"ga{i}", [*pa, i])) == sa
        r.on_finish(sa, f"a{i + 1}")
        assert r.route(RouteRequest(f"b{i + 1}", f"tb{i}", f"gb{i}", [*pb, i])) == sb
        r.on_finish(sb, f"b{i + 1}")
        assert why(r) is RouteReason.PREFIX


def test_new_groups_spread_despite_a_shared_header() -> None:
    clock = FakeClock()
    r = make(clock)  # defaults: cache_threshold 0.3, new_group_cache_threshold 0.9
    header = prompt(9, 24)  # 6 of 8 blocks shared by every group: 75% > 0.3
    first: dict[int, str] = {}
    for g in range(4):
        p = header + prompt(g, 8)
        for k in range(2):
            s = r.route(RouteRequest(f"g{g}s{k}", f"g{g}s{k}", f"g{g}", p))
            first.setdefault(g, s)
            assert s == first[g]  # siblings together
    assert sorted(first.values()) == ["a", "a", "b", "b"]
    assert r.in_flight() == {"a": 4, "b": 4}
    # a new group of an already-seen task (whole prompt cached) follows its prefix
    same_task = header + prompt(0, 8)
    assert r.route(RouteRequest("h0", "h0s0", "h0", same_task)) == first[0]
    assert why(r) is RouteReason.PREFIX


def test_equal_loads_go_to_the_longest_match() -> None:
    clock = FakeClock()
    r = make(clock, ("a", "b", "c"), session_idle_s=0)  # load = in flight only
    p = prompt(1)
    s = r.route(RouteRequest("r0", "t0", "g0", p))
    r.on_finish(s, "r0")
    for i in range(5):  # a new group, low match (half the prompt): load decides, ties -> match
        q = p[:16] + prompt(10 + i, 16)
        got = r.route(RouteRequest(f"q{i}", f"u{i}", f"h{i}", q))
        assert why(r) is RouteReason.LOAD
        assert got == s
        r.on_finish(got, f"q{i}")


def two_groups(r: CacheAwareRouter) -> tuple[str, str, list[int], list[int]]:
    """Group ga (4 conversations) on one server, gb (5) on the other; all in flight."""
    pa, pb = prompt(1), prompt(2)
    a = [r.route(RouteRequest(f"a{k}-0", f"a{k}", "ga", pa)) for k in range(4)]
    b = [r.route(RouteRequest(f"b{k}-0", f"b{k}", "gb", pb)) for k in range(5)]
    assert len(set(a)) == 1 and len(set(b)) == 1 and a[0] != b[0]
    return a[0], b[0], pa, pb


def test_conversations_in_tool_calls_still_count_as_load() -> None:
    # the measured defect: every ga conversation is in a tool call at once (0 in flight on
    # sa), gb's are generating; the next gb turn must not leave its cached context for sa
    for idle, expect in ((30.0, RouteReason.PREFIX), (0.0, RouteReason.IMBALANCE)):
        clock = FakeClock()
        r = make(clock, balance_abs_threshold=3, balance_rel_threshold=1.5, session_idle_s=idle)
        sa, sb, _, pb = two_groups(r)
        for k in range(4):
            r.on_finish(sa, f"a{k}-0")
        r.on_finish(sb, "b0-0")
        clock.advance(1.0)
        got = r.route(RouteRequest("b0-1", "b0", "gb", [*pb, 7, 7, 7, 7]))
        assert why(r) is expect
        assert got == (sb if expect is RouteReason.PREFIX else sa)
        if idle:
            assert r.session_load() == {sa: 4, sb: 5}  # 4 parked vs 4 + the new turn


def test_parked_conversations_expire_after_session_idle() -> None:
    clock = FakeClock()
    r = make(clock, balance_abs_threshold=3, balance_rel_threshold=1.5, session_idle_s=30.0)
    sa, sb, _, pb = two_groups(r)
    for k in range(4):
        r.on_finish(sa, f"a{k}-0")  # ga's conversations never come back
    r.on_finish(sb, "b0-0")
    clock.advance(30.0)  # exactly session_idle_s: expired
    got = r.route(RouteRequest("b0-1", "b0", "gb", [*pb, 7, 7, 7, 7]))
    assert why(r) is RouteReason.IMBALANCE and got == sa
    assert r.session_load() == {sa: 1, sb: 4}


def test_new_group_goes_where_fewer_conversations_live() -> None:
    clock = FakeClock()
    r = make(clock, session_idle_s=30.0)
    sa, sb, _, _ = two_groups(r)
    for k in range(4):
        r.on_finish(sa, f"a{k}-0")  # 0 in flight but 4 conversations in tools on sa
    for k in range(2):
        r.on_finish(sb, f"b{k}-0")
        r.on_abort(sb, f"b{k}-0")  # already finished: ignored, no double count
    r.on_abort(sb, "b2-0")  # an aborted conversation is not parked
    r.on_abort(sb, "b3-0")
    assert r.session_load() == {sa: 4, sb: 3}
    assert r.in_flight() == {sa: 0, sb: 1}
    assert r.route(RouteRequest("n0", "n0", "gn", prompt(3))) == sb
    assert why(r) is RouteReason.LOAD
    # a parked conversation's next turn moves it from parked to in flight (counted once)
    r.route(RouteRequest("a0-1", "a0", "ga", [*prompt(1), 5, 5, 5, 5]))
    assert r.session_load() == {sa: 4, sb: 4}
