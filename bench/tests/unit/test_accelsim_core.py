"""accelsim benchmark engine: latency model, continuous batching and prefix cache (hand cases).

The core is pure: tests move time by hand (``plan(now)`` / ``apply(step, now + duration)``).
"""

from __future__ import annotations

import math

import pytest

from rollbank_bench.accelsim.core import EngineCore, SimRequest, Step
from rollbank_bench.accelsim.profile import LatencyProfile, load_profile, profile_names
from rollbank_bench.accelsim.tokens import TokenSource


def prof(**kw: object) -> LatencyProfile:
    base: dict[str, object] = dict(
        name="t", source="test", block_size=4, kv_capacity_tokens=64, max_num_seqs=8,
        max_num_batched_tokens=64, max_model_len=256, vocab_size=1000, eos_token_id=None,
        step_base_s=0.01, decode_per_seq_s=0.001, decode_per_ctx_token_s=0.0001,
        prefill_per_token_s=0.0002, prefill_per_seq_s=0.003,
    )
    base.update(kw)
    return LatencyProfile.model_validate(base)


def req(core: EngineCore, rid: str, prompt: list[int], max_tokens: int = 3, *, min_tokens: int = 0,
        stop: frozenset[int] = frozenset(), vocab: int | None = None, ns: str = "base") -> SimRequest:
    src = TokenSource(seed=0, namespace=ns, prompt=prompt, vocab_size=vocab or core.profile.vocab_size,
                      temperature=0.0, request_id=rid, avoid=stop)
    return SimRequest(engine_id=rid, prompt=prompt, max_tokens=max_tokens, tokens=src, namespace=ns,
                      min_tokens=min_tokens, stop_ids=stop)


def run(core: EngineCore, now: float = 0.0) -> tuple[float, list[Step]]:
    steps: list[Step] = []
    while (step := core.plan(now)) is not None:
        now += step.duration
        core.apply(step, now)
        steps.append(step)
    return now, steps


def test_step_time_hand_case() -> None:
    p = prof()
    assert p.step_time() == 0.0
    # 0.01 + 2 seqs x 0.001 + 30 ctx x 0.0001 + 10 prefill x 0.0002 + 1 seq x 0.003
    got = p.step_time(prefill_tokens=10, prefill_seqs=1, decode_seqs=2, decode_ctx_tokens=30)
    assert math.isclose(got, 0.01 + 0.002 + 0.003 + 0.002 + 0.003)


def test_single_request_ttft_and_decode_steps() -> None:
    core = EngineCore(prof())
    r = req(core, "a", list(range(10)), max_tokens=3)
    core.add(r, 0.0)
    end, steps = run(core)
    # step 1: prefill 10 tokens (and the first token); steps 2-3: decode at ctx 11, 12
    assert [len(s.decode) for s in steps] == [0, 1, 1]
    assert r.first_token_at == pytest.approx(0.01 + 10 * 0.0002 + 0.003)
    assert steps[1].duration == pytest.approx(0.01 + 0.001 + 11 * 0.0001)
    assert steps[2].duration == pytest.approx(0.01 + 0.001 + 12 * 0.0001)
    assert r.finish_reason == "length" and len(r.output) == 3 and r.finished_at == pytest.approx(end)
    assert all(t < 1000 for t in r.output) and all(-6 <= lp < 0 for lp in r.logprobs)


def test_prefix_hit_miss_and_accounting() -> None:
    core = EngineCore(prof())
    prompt = list(range(1, 11))  # 10 tokens, block 4: lookup covers 9 -> 2 full blocks
    core.add(req(core, "a", prompt), 0.0)
    t, _ = run(core)
    b = req(core, "b", prompt)
    c = req(core, "c", [99, *prompt[1:]])  # first block differs: whole chain misses
    core.add(b, t)
    core.add(c, t)
    run(core, t)
    assert (b.cached, c.cached) == (8, 0)
    assert core.counters.prefix_cache_queries == 30 and core.counters.prefix_cache_hits == 8
    lora = req(core, "d", prompt, ns="lora:x")  # another adapter never shares blocks
    core.add(lora, 10.0)
    run(core, 10.0)
    assert lora.cached == 0


def test_lru_eviction_under_finite_capacity() -> None:
    core = EngineCore(prof(kv_capacity_tokens=16))  # 4 blocks of 4
    p1, p2 = list(range(100, 109)), list(range(200, 209))  # 9 tokens: 2 blocks each + outputs
    t = 0.0
    for rid, p in (("a", p1), ("b", p2)):
        core.add(req(core, rid, p, max_tokens=1), t)
        t, _ = run(core, t)
    again1 = req(core, "a2", p1, max_tokens=1)
    core.add(again1, t)
    t, _ = run(core, t)
    assert again1.cached == 8  # both fit (4 blocks)
    p3 = list(range(300, 309))
    core.add(req(core, "c", p3, max_tokens=1), t)
    t, _ = run(core, t)
    again2 = req(core, "b2", p2, max_tokens=1)  # p2 was least recently used: evicted for p3
    again1b = req(core, "a3", p1, max_tokens=1)
    core.add(again2, t)
    t, _ = run(core, t)
    core.add(again1b, t)
    run(core, t)
    assert again2.cached == 0
    # LRU order was [p1, p3]; re-inserting p2 evicted p1 (least recently used), p3 stays
    assert again1b.cached == 0
    assert len(core.cache) == 4


def test_chunked_prefill_respects_token_budget_and_batches_decode() -> None:
    core = EngineCore(prof(max_num_batched_tokens=8))
    short = req(core, "s", [1, 2, 3], max_tokens=5)
    core.add(short, 0.0)
    step = core.plan(0.0)
    assert step is not None and [c for _, c in step.prefill] == [3]
    core.apply(step, step.duration)
    long = req(core, "l", list(range(10, 30)), max_tokens=2)  # 20 tokens
    core.add(long, step.duration)
    chunks = []
    now = step.duration
    while long.first_token_at is None:
        s = core.plan(now)
        assert s is not None
        assert len(s.decode) + sum(c for _, c in s.prefill) <= 8
        chunks += [c for r, c in s.prefill if r is long]
        now += s.duration
        core.apply(s, now)
    assert chunks == [7, 7, 6]  # 1 of the 8 goes to the short request's decode each step


def test_min_tokens_and_stop_ids() -> None:
    core = EngineCore(prof(vocab_size=2))
    r = req(core, "a", [1, 0, 1], max_tokens=50, min_tokens=4, stop=frozenset({1}), vocab=2)
    core.add(r, 0.0)
    run(core)
    assert r.output[:4] == [0, 0, 0, 0]  # the stop id is masked before min_tokens
    assert r.finish_reason == "stop" and r.output[-1] == 1 and 1 not in r.output[:-1]


def test_abort_keeps_partial_output_and_versions_follow_label() -> None:
    core = EngineCore(prof())
    r = req(core, "a", list(range(8)), max_tokens=10)
    core.add(r, 0.0)
    now = 0.0
    for _ in range(3):
        s = core.plan(now)
        assert s is not None
        now += s.duration
        core.apply(s, now)
        core.weight_version = "1"
    assert core.abort("a", now) is r
    assert r.finish_reason == "abort" and len(r.output) == 3
    assert r.versions == ["default", "1", "1"]
    assert core.idle and core.plan(now) is None


def test_kv_capacity_queues_instead_of_preempting() -> None:
    core = EngineCore(prof(kv_capacity_tokens=16))
    a = req(core, "a", list(range(12)), max_tokens=3)
    b = req(core, "b", list(range(50, 62)), max_tokens=3)
    core.add(a, 0.0)
    core.add(b, 0.0)
    step = core.plan(0.0)
    assert step is not None and [r.engine_id for r, _ in step.prefill] == ["a"]
    core.apply(step, step.duration)
    run(core, step.duration)
    assert a.finished_at is not None and b.scheduled_at is not None
    assert b.scheduled_at >= a.finished_at  # admitted only once a's KV blocks were freed


def test_profiles_load_with_sources() -> None:
    assert "h100-llama3.1-8b" in profile_names()
    for name in profile_names():
        p = load_profile(name)
        assert p.source.strip() and p.step_time(decode_seqs=1) > 0


def test_greedy_tokens_repeat_and_sampled_siblings_differ() -> None:
    def src(rid: str, temp: float) -> TokenSource:
        return TokenSource(seed=1, namespace="w", prompt=[5, 6], vocab_size=50000, temperature=temp, request_id=rid)

    assert [src("x", 0).token(i, allow=True) for i in range(5)] == [src("y", 0).token(i, allow=True) for i in range(5)]
    assert [src("x", 1).token(i, allow=True) for i in range(5)] != [src("y", 1).token(i, allow=True) for i in range(5)]


def test_sibling_scheduled_after_a_chunk_hits_it_before_it_is_computed() -> None:
    core = EngineCore(prof(max_num_batched_tokens=8))
    prompt = list(range(1, 21))  # 20 tokens: chunks of 8, 8, 4
    first, second = req(core, "a", prompt), req(core, "b", prompt)
    core.add(first, 0.0)
    core.add(second, 0.0)
    now = 0.0
    for _ in range(2):  # steps 1-2: first's chunks of 8 use the whole budget
        step = core.plan(now)
        assert step is not None and [r.engine_id for r, _ in step.prefill] == ["a"]
        now += step.duration
        core.apply(step, now)
    step = core.plan(now)  # step 3: first's last 4 tokens, then second is admitted
    assert step is not None and [(r.engine_id, c) for r, c in step.prefill] == [("a", 4), ("b", 4)]
    # every block of first's prompt was registered when scheduled (vLLM V1), though the last
    # chunk is computed in this very step: second hits 16 of its 19 looked-up tokens and prefills the last 4
    assert second.cached == 16 and first.first_token_at is None
