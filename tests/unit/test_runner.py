"""EpisodeRunner against the fakes: fake sandboxes (warm pool), fake servers, scripted model."""

from __future__ import annotations

import asyncio

import pytest
from episode_rig import FileVerifier, cancel_while_closing, hanging_shell_close, rig, script

from rollbank.clock import FakeClock
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.harnesses import FencedShellHarness
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.runner import EpisodeRunner
from rollbank.episodes.spans import spans_of
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.protocol import GenerateRequest
from rollbank.routing.factory import make_router
from rollbank.sandbox.fake import FakeBackend, FakeSandbox
from rollbank.sandbox.protocol import Sandbox

TOK = FakeTokenizer()
SOLVE = "```bash\necho hello > out.txt\n```\n"


async def test_a_solved_episode_is_recorded_end_to_end() -> None:
    async with rig(script(SOLVE, "DONE\n")) as r:
        t = await r.run(slot=1)
    assert t.outcome is not None and t.outcome.reason is Reason.VERIFIED_PASS
    assert t.outcome.reward == 1.0
    assert (t.trajectory_id, t.group_id, t.attempt, t.seed) == ("g0/s1/r0", "g0", 1, 8)
    assert t.task_hash == "hash-hello" and t.layer_hashes == ["layer-a"]
    assert [s.action for s in t.steps] == ["echo hello > out.txt", None]
    assert t.steps[0].exit_code == 0 and "[exit code 0]" in t.steps[0].observation
    # token bookkeeping: model tokens masked 1 with log-probs, observations masked 0
    assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs) == len(t.policy_versions)
    assert t.num_model_tokens > 0 and t.prompt_len > 0
    assert all(lp < 0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m)
    kinds = [s.kind for s in spans_of(t)]
    assert kinds.count("inference") == 2 and kinds.count("exec") == 1
    assert {"sandbox_setup", "verify", "episode"} <= set(kinds)
    assert len(t.servers) == 2  # round robin alternated servers
    assert r.backend.started and not r.backend.live  # the sandbox was closed
    assert r.recorded == [t]


async def test_malformed_output_until_max_turns_is_a_model_failure() -> None:
    async with rig(script("I think I should list files."), max_turns=3) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE, Reason.MAX_TURNS)
    assert len(t.steps) == 3 and all("rollbank:" in s.observation for s in t.steps)
    assert r.verifier.calls == 1  # verifier still ran: reward recorded
    assert t.outcome.reward == 0.0


async def test_sandbox_start_failure_is_infra() -> None:
    async with rig(script(SOLVE), backend=FakeBackend(fail_starts=1)) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE,
                                                      Reason.SANDBOX_START_FAILED)
    assert t.steps == [] and r.verifier.calls == 0


async def test_dead_inference_server_is_infra_and_router_released() -> None:
    async with rig(script(SOLVE, "DONE"), servers=1) as r:
        r.servers[0].kill()
        t = await r.run()
        assert dict(r.runner.router.in_flight()) == {r.servers[0].base_url: 0}
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE,
                                                      Reason.INFERENCE_ERROR)
    assert "EngineDead" in t.outcome.evidence["error"]
    assert not r.backend.live


async def test_step_timeout_is_the_models_failure() -> None:
    clock = FakeClock()
    backend = FakeBackend(clock, files={"/app/.keep": b""})
    async with rig(script("```bash\nsleep 100\n```\n"), backend=backend, step_timeout_s=5,
                   step_timeout_ends_episode=True) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE, Reason.STEP_TIMEOUT)
    assert t.steps[0].timed_out and "timed out" in t.steps[0].observation


async def test_budget_exhaustion_is_the_models_failure_and_not_charged_to_verifier() -> None:
    clock = FakeClock()
    backend = FakeBackend(clock, files={"/app/.keep": b""})
    async with rig(script("```bash\nsleep 4\n```\n"), backend=backend, step_timeout_s=10,
                   episode_budget_s=10, max_turns=10) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE,
                                                      Reason.BUDGET_EXHAUSTED)
    assert len(t.steps) == 3  # 4 + 4 + (2 of 4): the third command hits the budget
    assert r.verifier.calls == 1 and t.outcome.reward == 0.0


async def test_verifier_crash_on_healthy_sandbox_is_infra() -> None:
    async with rig(script(SOLVE, "DONE"), crash=True) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE,
                                                      Reason.VERIFIER_CRASH)


def _wreck(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
    sb.closed = True  # the runtime is gone after this command
    return 137, b"", b""


async def test_sandbox_killed_by_the_model_is_a_model_failure() -> None:
    backend = FakeBackend(handlers={"kill": _wreck}, files={"/app/.keep": b""})
    async with rig(script("```bash\nkill -9 -1\n```\n"), backend=backend) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE,
                                                      Reason.SANDBOX_WRECKED)


def _host_dies(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
    sb.closed = True
    sb.backend.fail_starts = 1  # the host is broken: a pristine fork cannot start either
    return 137, b"", b""


async def test_sandbox_dying_with_a_broken_host_is_infra() -> None:
    backend = FakeBackend(handlers={"compute": _host_dies}, files={"/app/.keep": b""})
    async with rig(script("```bash\ncompute --fast\n```\n"), backend=backend) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE, Reason.SANDBOX_DIED)
    assert t.outcome.evidence["experiment"]["pristine_probe"]["state"] == "dead"


async def test_context_exhaustion_is_the_models_failure() -> None:
    async with rig(script("```bash\nls\n```\n"), max_model_len=1600, max_turns=50) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE,
                                                      Reason.CONTEXT_EXHAUSTED)
    assert len(t.token_ids) <= 1600 and len(t.steps) >= 1


async def test_a_first_prompt_that_does_not_fit_is_not_the_models_failure() -> None:
    """Was: context_exhausted (model_failure) for an attempt whose model never acted (the
    harness's prompt alone outgrew runner.max_model_len, e.g. after longer few-shot examples)."""
    async with rig(script("```bash\nls\n```\n"), max_model_len=300, max_turns=50) as r:
        t = await r.run()
    assert t.outcome is not None and not t.steps
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE,
                                                      Reason.PROMPT_EXCEEDS_CONTEXT)
    assert t.outcome.evidence["prompt_tokens"] > 300


async def test_cancellation_closes_the_sandbox_and_releases_the_router() -> None:
    gate = asyncio.Event()

    async def slow(sb: Sandbox) -> None:
        await gate.wait()

    async with rig(script("```bash\nsleep 1\n```\n"), max_turns=50) as r:
        for s in r.servers:
            s.decode_s_per_token = 0.01
        task = asyncio.create_task(r.run())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not r.backend.live
        assert all(v == 0 for v in r.runner.router.in_flight().values())


async def test_cancelled_while_the_shell_closes_the_sandbox_is_still_closed() -> None:
    # The fault soak's lingering sandbox: an episode ending without verification (here a
    # runner bug; in the soak a stalled/frozen sandbox or an engine fault) closes its shell
    # first; a frozen shell's close waits for it to exit, and an abort of the attempt landing
    # then must not skip the sandbox's close (it stayed alive until the backend closed).
    entered, hold, hanging_close = hanging_shell_close()
    solve = script(SOLVE)

    def respond(req: GenerateRequest) -> str:
        prompt = TOK.decode(list(req.prompt_token_ids)).split("Task: Write hello")[-1]
        if prompt.count("\nOutput:"):
            raise KeyError("boom")  # second turn: the episode ends unverified
        return solve(req) or ""

    async with rig(respond, backend=FakeBackend(files={"/app/.keep": b""},
                                                shell_close=hanging_close)) as r:
        await cancel_while_closing(asyncio.create_task(r.run()), entered)
        assert r.backend.started and not r.backend.live
        hold.set()


async def test_unexpected_runner_bug_is_recorded_not_raised() -> None:
    def broken(req: GenerateRequest) -> str:
        raise KeyError("boom")

    async with rig(broken) as r:
        t = await r.run()
    assert t.outcome is not None and t.outcome.reason is Reason.HOST_ERROR
    assert "KeyError" in t.outcome.evidence["error"]
    assert not r.backend.live


def test_runner_refuses_router_servers_without_clients() -> None:
    _, clients = make_fake_fleet(1)
    with pytest.raises(ValueError, match="without a client"):
        EpisodeRunner(RunnerConfig(), tasks={}, source=None, verifier=FileVerifier(),  # type: ignore[arg-type]
                      harness=FencedShellHarness(), tokenizer=TOK, clients={},
                      router=make_router("round_robin", ["a"], FakeClock()))
    assert clients


async def test_a_host_stall_is_not_billed_to_the_models_step_timeout_or_budget() -> None:
    clock = FakeClock()  # every command is stalled 50 s by the host, far past both limits
    backend = FakeBackend(clock, files={"/app/.keep": b""}, stall_s=50.0)
    async with rig(script("```bash\nsleep 1\n```\n"), backend=backend, step_timeout_s=5,
                   episode_budget_s=10, max_turns=3, step_timeout_ends_episode=True) as r:
        t = await r.run()
    assert t.outcome is not None
    assert t.outcome.reason is Reason.MAX_TURNS and len(t.steps) == 3
    assert not any(s.timed_out for s in t.steps)


async def test_a_host_stall_beyond_the_cap_is_infra_not_a_timeout() -> None:
    clock = FakeClock()
    backend = FakeBackend(clock, files={"/app/.keep": b""}, stall_s=50.0, max_host_stall_s=20.0)
    async with rig(script("```bash\nsleep 1\n```\n"), backend=backend, step_timeout_s=5,
                   step_timeout_ends_episode=True) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE, Reason.HOST_STALLED)
    assert t.outcome.evidence["host_stalled"] is True
