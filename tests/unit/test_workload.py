"""Trace workload: deterministic Terminal-Bench-shaped plans, and the runner following them."""

from __future__ import annotations

import statistics

import pytest
from episode_rig import rig, script
from pydantic import ValidationError

from rollbank.clock import FakeClock
from rollbank.episodes.harnesses import ActionKind
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.workload import TraceWorkload, WorkloadConfig, make_workload
from rollbank.inference.fake import FakeInferenceServer
from rollbank.inference.fake_client import FakeInferenceClient
from rollbank.inference.protocol import GenerateRequest, SamplingParams
from rollbank.sandbox.fake import FakeBackend


def trace(**kw: object) -> TraceWorkload:
    return TraceWorkload(WorkloadConfig.model_validate({"kind": "trace", **kw}))


def test_plans_depend_only_on_config_task_and_seed() -> None:
    a, b = trace(), trace()
    assert a.plan("t1", 7) == b.plan("t1", 7)  # every arm / retry replays the same episode
    assert a.plan("t1", 7) != a.plan("t1", 8)
    assert a.plan("t1", 7) != trace(seed=1).plan("t1", 7)
    assert make_workload(WorkloadConfig()) is None  # kind = "model": the model decides
    assert isinstance(make_workload(WorkloadConfig(kind="trace")), TraceWorkload)


def test_turn_counts_follow_the_configured_shape() -> None:
    w = trace(turns_median=8, turns_task_sigma=0.7, turns_attempt_sigma=0.5, max_turns=48)
    turns = [len(w.plan(f"task{i}", s).turns) for i in range(60) for s in range(20)]
    assert 6.5 <= statistics.median(turns) <= 9.5
    assert max(turns) <= 48 and min(turns) >= 1
    assert max(turns) >= 4 * statistics.median(turns)  # a heavy tail: the point of the trace
    # hard tasks are hard for every sibling: the per-task factor orders the task means
    by_task = {f"task{i}": statistics.fmean(len(w.plan(f"task{i}", s).turns) for s in range(40))
               for i in range(20)}
    hardest = max(by_task, key=by_task.__getitem__)
    easiest = min(by_task, key=by_task.__getitem__)
    assert w.task_factor(hardest) > w.task_factor(easiest)


def test_no_spread_means_fixed_turns_and_clamped_values() -> None:
    w = trace(turns_median=5, turns_task_sigma=0, turns_attempt_sigma=0, tool_latency_median_s=9,
              tool_latency_sigma=2.0, tool_latency_max_s=4.0, tokens_min=3, tokens_max=5)
    for s in range(30):
        p = w.plan("t", s)
        assert len(p.turns) == 5
        assert all(0 < t.tool_s <= 4.0 and 3 <= t.tokens <= 5 for t in p.turns)
        assert [p.action(k).kind for k in range(5)] == [ActionKind.COMMANDS] * 4 + [ActionKind.DONE]
        assert p.action(0).commands[0].text == f"sleep {p.turns[0].tool_s:.3f}"
    assert len(trace(turns_median=500, max_turns=12).plan("t", 0).turns) == 12


def test_invalid_config_names_the_fields() -> None:
    with pytest.raises(ValidationError, match="tokens_min"):
        WorkloadConfig(tokens_min=9, tokens_max=2)
    with pytest.raises(ValidationError, match="kind"):
        WorkloadConfig.model_validate({"kind": "replay"})


def test_turn_sampling_forces_the_token_count() -> None:
    t = trace(tokens_min=7, tokens_max=7).plan("t", 0).turns[0]
    base = SamplingParams(max_tokens=192, stop=("\nOutput:",), stop_token_ids=(2,))
    sp = t.sampling(base, room=100)
    assert (sp.max_tokens, sp.min_tokens, sp.stop, sp.stop_token_ids) == (7, 7, (), ())
    assert t.sampling(base, room=4).max_tokens == 4  # never past the context


async def test_fake_server_honours_min_tokens() -> None:
    client = FakeInferenceClient(FakeInferenceServer(responder=lambda r: "DONE\n"))
    short = await client.generate(GenerateRequest("a", [1, 2, 3], SamplingParams(max_tokens=20)))
    forced = await client.generate(GenerateRequest("b", [1, 2, 3], SamplingParams(
        max_tokens=20, min_tokens=20, stop=("\nOutput:",))))
    assert short.finish_reason == "stop" and len(short.token_ids) < 20
    assert forced.finish_reason == "length" and len(forced.token_ids) == 20


async def test_runner_follows_the_plan_with_real_tokens_and_sandbox_time() -> None:
    clock = FakeClock()
    w = trace(turns_median=4, turns_task_sigma=0, turns_attempt_sigma=0, tokens_min=5,
              tokens_max=9, tool_latency_median_s=2.0)
    # the scripted model would solve the task in one turn: the trace, not the model, decides
    solve = "```bash\necho hello > out.txt\n```\nDONE\n"
    backend = FakeBackend(clock, files={"/app/.keep": b""})
    async with rig(script(solve), backend=backend, workload=w, max_turns=2) as r:
        t = await r.run(slot=1)
    plan = w.plan("hello", t.seed)
    assert len(t.steps) == len(plan.turns) == 4  # the plan's turn count replaces max_turns
    assert [s.action for s in t.steps] == [f"sleep {p.tool_s:.3f}" for p in plan.turns]
    gen = [sum(1 for _ in g) for g in _model_runs(t.loss_mask)]
    assert gen == [p.tokens for p in plan.turns]  # exactly the planned tokens per turn
    assert clock.now() == pytest.approx(plan.tool_s, abs=1e-6)  # the sandbox slept the plan
    assert t.meta["workload"] == {"kind": "trace", "turns": 4, "tokens": plan.tokens,
                                  "tool_s": round(plan.tool_s, 3)}
    assert t.outcome is not None and r.verifier.calls == 1  # verified for real
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE, Reason.VERIFIED_FAIL)


def _model_runs(mask: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    prev = 0
    for m in mask:
        if m and not prev:
            runs.append([])
        if m:
            runs[-1].append(m)
        prev = m
    return runs


def _plans_digest(w: TraceWorkload) -> str:
    import hashlib

    h = hashlib.sha256()
    for i in range(200):
        p = w.plan(f"t{i % 7}", i)
        h.update(repr([(t.tokens, t.tool_s, t.command().text) for t in p.turns]).encode())
    return h.hexdigest()


def test_agent_fields_at_their_defaults_leave_every_plan_as_before() -> None:
    # digest of the plans before tokens_median / observation_chars_* existed (same draws)
    assert _plans_digest(trace(seed=3)) == (
        "669bfe87c50edfffbd2a9cab93d74eee8aef38048a143b0fd5e76a047ecb10f7")


def test_lognormal_tokens_and_printed_observations() -> None:
    w = trace(tokens_median=100, tokens_sigma=0.5, tokens_min=10, tokens_max=300,
              observation_chars_median=120, observation_chars_sigma=0.6,
              observation_chars_max=400)
    turns = [t for s in range(300) for t in w.plan("t", s).turns]
    tokens = [t.tokens for t in turns]
    assert 85 <= statistics.median(tokens) <= 115 and min(tokens) >= 10 and max(tokens) <= 300
    assert max(tokens) > 2 * statistics.median(tokens)  # a spread, not a constant
    chars = [t.obs_chars for t in turns]
    assert 100 <= statistics.median(chars) <= 140 and max(chars) <= 400
    cmd = turns[0].command().text
    assert cmd.startswith(f"sleep {turns[0].tool_s:.3f}; seq ") and cmd.endswith(
        f"head -c {turns[0].obs_chars}")
    with pytest.raises(ValidationError):
        WorkloadConfig(kind="trace", observation_chars_max=50_000)  # seq prints ~45 kB



def test_agent_shaped_plans_are_pinned_and_turn_values_match_the_plans() -> None:
    w = trace(seed=3, tokens_median=100, tokens_sigma=0.5, tokens_max=300,
              observation_chars_median=120, observation_chars_sigma=0.6)
    # digest of these plans drawn with random.Random's own gauss/randint (before the inlining)
    assert _plans_digest(w) == "668175d7a3f4d5abbccb349da64e7f7110ca9ced4dc4c6c099c5625126be7834"
    for s in range(50):
        assert [(t.tokens, t.tool_s, t.obs_chars) for t in w.plan("t", s).turns] == \
            w.turn_values("t", s)
