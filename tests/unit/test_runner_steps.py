"""Multi-step tasks in the EpisodeRunner (``episodes/steps.py``) against the fakes.

A two-step task: step ``one`` asks for hello in /app/out.txt, step ``two`` for world in
/app/two.txt. The scripted model answers per step (the step it is on is the last ``Task:``
line of its prompt); a per-step verifier checks the step it is given (``Task.for_step``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from episode_rig import TOK, FileVerifier, fake_spec, make_task, rig

from rollbank.clock import FakeClock
from rollbank.episodes.attribution import VerifierVerdict
from rollbank.episodes.episode_file import parse_episode
from rollbank.episodes.harnesses import FencedShellHarness
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.replay import episode_record, load_episode, replay_episode, write_episode
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.steps import trial_outcome
from rollbank.episodes.workload import TraceWorkload, WorkloadConfig
from rollbank.inference.protocol import GenerateRequest
from rollbank.sandbox.fake import FakeBackend, FakeSandbox
from rollbank.sandbox.pool import WarmPool
from rollbank.sandbox.protocol import Sandbox
from rollbank.tasks.model import MinReward, Task, TaskStep

ONE = "Write hello to /app/out.txt."
TWO = "Write world to /app/two.txt."
SOLVE_ONE = "```bash\necho hello > out.txt\n```\n"
SOLVE_TWO = "```bash\necho world > two.txt\n```\n"
WRONG = "```bash\necho nope > out.txt\n```\n"
WRONG_TWO = "```bash\necho nope > two.txt\n```\n"


def two_step_task(*, min_reward: MinReward | None = None, strategy: str = "mean",
                  one_counts: bool = True, setup_dir: Path | None = None) -> Task:
    steps = (TaskStep("one", ONE, None, min_reward=min_reward, contributes_to_mean=one_counts),
             TaskStep("two", TWO, None, setup_dir=setup_dir))
    return dataclasses.replace(make_task(), instruction=ONE, steps=steps,
                               multi_step_reward_strategy=strategy, schema_version="1.1")


class StepVerifier(FileVerifier):
    """Verifies the step it is given: ``one`` -> /app/out.txt, ``two`` -> /app/two.txt."""

    def __init__(self, *, crash_on: str | None = None) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.crash_on = crash_on

    async def verify(self, sandbox: Sandbox, task: Task) -> VerifierVerdict:
        self.calls += 1
        self.seen.append(task.instruction)
        if task.instruction == self.crash_on:
            return VerifierVerdict(None, error=Reason.VERIFIER_CRASH, detail="Traceback")
        path, want = ("/app/out.txt", b"hello") if task.instruction == ONE else ("/app/two.txt",
                                                                                 b"world")
        await sandbox.write_file("/tests/secret.txt", b"answer key")  # as a real verifier
        try:
            ok = (await sandbox.read_file(path)).strip() == want
        except FileNotFoundError:
            ok = False
        return VerifierVerdict(1.0 if ok else 0.0, {"reward": 1.0 if ok else 0.0}, passed=ok)


Responder = Callable[[GenerateRequest], str]


def per_step(one: list[str], two: list[str], prompts: list[str]) -> Responder:
    """Says ``one[k]`` / ``two[k]`` at turn k of the step named by the prompt's last Task line."""

    def respond(req: GenerateRequest) -> str:
        prompt = TOK.decode(list(req.prompt_token_ids))
        prompts.append(prompt)
        current = prompt.rsplit("\nTask: ", 1)[-1]
        turns = one if current.startswith(ONE) else two
        assert current.startswith((ONE, TWO)), current[:80]
        return turns[min(current.count("\nOutput:"), len(turns) - 1)]

    return respond


async def test_step_one_passes_step_two_fails_per_step_rewards_and_mean() -> None:
    prompts: list[str] = []
    verifier = StepVerifier()
    async with rig(per_step([SOLVE_ONE, "DONE\n"], [WRONG_TWO, "DONE\n"], prompts),
                   task=two_step_task(), verifier=verifier) as r:
        t = await r.run()
    o = t.outcome
    assert o is not None
    assert [(s.name, s.reward) for s in t.task_steps] == [("one", 1.0), ("two", 0.0)]
    assert [s.reason for s in t.task_steps] == ["verified_pass", "verified_fail"]
    assert (o.outcome, o.reason, o.reward) == (Outcome.MODEL_FAILURE, Reason.VERIFIED_FAIL, 0.5)
    assert o.rewards == {"one": 1.0, "two": 0.0}
    assert [s["reward"] for s in o.evidence["task_steps"]] == [1.0, 0.0]
    assert "stopped_after" not in o.evidence
    # each step verified with its own view, in order; same conversation, turns continue
    assert verifier.seen == [ONE, TWO]
    assert [(s.index, s.task_step) for s in t.steps] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert [(s.first_turn, s.turns) for s in t.task_steps] == [(0, 2), (2, 2)]
    assert prompts[2].startswith(prompts[1])  # step two's prompt extends the conversation
    assert "\nTask: " + TWO in prompts[2] and TWO not in prompts[1]
    # step two does not see what step one's verifier left in /tests
    assert r.recorded == [t]
    # the episode file carries the per-step results and parses as a typed record
    rec = parse_episode(episode_record(t, two_step_task(), t.meta))
    assert [(e.name, e.reward, e.reason) for e in rec.task_steps] == [
        ("one", 1.0, Reason.VERIFIED_PASS), ("two", 0.0, Reason.VERIFIED_FAIL)]
    assert [e.task_step for e in rec.steps] == [0, 0, 1, 1]


async def test_final_strategy_takes_the_last_steps_reward() -> None:
    async with rig(per_step([SOLVE_ONE, "DONE\n"], [WRONG_TWO, "DONE\n"], []),
                   task=two_step_task(strategy="final"), verifier=StepVerifier()) as r:
        t = await r.run()
    assert t.outcome is not None and t.outcome.reward == 0.0
    assert t.outcome.reason is Reason.VERIFIED_FAIL


async def test_a_step_left_out_of_the_mean_does_not_count() -> None:
    async with rig(per_step([WRONG, "DONE\n"], [SOLVE_TWO, "DONE\n"], []),
                   task=two_step_task(one_counts=False), verifier=StepVerifier()) as r:
        t = await r.run()
    assert [s.reward for s in t.task_steps] == [0.0, 1.0]
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason, t.outcome.reward) == (
        Outcome.MODEL_SUCCESS, Reason.VERIFIED_PASS, 1.0)


async def test_both_steps_pass_is_a_model_success() -> None:
    async with rig(per_step([SOLVE_ONE, "DONE\n"], [SOLVE_TWO, "DONE\n"], []),
                   task=two_step_task(min_reward=1.0), verifier=StepVerifier()) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason, t.outcome.reward) == (
        Outcome.MODEL_SUCCESS, Reason.VERIFIED_PASS, 1.0)
    assert [s.passed_min_reward for s in t.task_steps] == [True, True]


@pytest.mark.parametrize("gate", [1.0, {"reward": 1.0}])
async def test_min_reward_missed_stops_before_step_two(gate: MinReward) -> None:
    prompts: list[str] = []
    verifier = StepVerifier()
    async with rig(per_step([WRONG, "DONE\n"], [SOLVE_TWO, "DONE\n"], prompts),
                   task=two_step_task(min_reward=gate), verifier=verifier) as r:
        t = await r.run()
    o = t.outcome
    assert o is not None
    assert not any(TWO in p for p in prompts)  # step two was never prompted
    assert verifier.seen == [ONE]
    assert [(s.name, s.reward, s.passed_min_reward) for s in t.task_steps] == [("one", 0.0, False)]
    assert (o.outcome, o.reason, o.reward) == (Outcome.MODEL_FAILURE, Reason.VERIFIED_FAIL, 0.0)
    assert (o.evidence["stopped_after"], o.evidence["stop_reason"]) == ("one", "min_reward")
    assert all(s.task_step == 0 for s in t.steps)


async def test_a_verifier_crash_in_a_step_is_attributed_like_a_single_step_one() -> None:
    # the pristine re-verify (the same crashing verifier) fails the same way: infra
    verifier = StepVerifier(crash_on=TWO)
    async with rig(per_step([SOLVE_ONE, "DONE\n"], [SOLVE_TWO, "DONE\n"], []),
                   task=two_step_task(), verifier=verifier) as r:
        t = await r.run()
    o = t.outcome
    assert o is not None
    assert (o.outcome, o.reason, o.reward) == (Outcome.INFRA_FAILURE, Reason.VERIFIER_CRASH, None)
    assert "experiment" in o.evidence and o.evidence["task_step_name"] == "two"
    assert [s.reason for s in t.task_steps] == ["verified_pass", "verifier_crash"]
    assert verifier.seen == [ONE, TWO, TWO]  # step two's verifier, then its pristine re-verify


async def test_an_infra_failure_in_step_one_stops_the_trial() -> None:
    verifier = StepVerifier(crash_on=ONE)
    prompts: list[str] = []
    async with rig(per_step([SOLVE_ONE, "DONE\n"], [SOLVE_TWO, "DONE\n"], prompts),
                   task=two_step_task(), verifier=verifier) as r:
        t = await r.run()
    assert t.outcome is not None and t.outcome.outcome is Outcome.INFRA_FAILURE
    assert t.outcome.evidence["stop_reason"] == "step_not_attributable_to_model"
    assert not any(TWO in p for p in prompts)


async def test_step_setup_runs_before_the_step_and_tests_are_cleared(tmp_path: Path) -> None:
    setup = tmp_path / "workdir"
    setup.mkdir()
    (setup / "seed.txt").write_text("seeded\n")
    look = "```bash\ncat seed.txt; cat /tests/secret.txt\n```\n"
    async with rig(per_step([SOLVE_ONE, "DONE\n"], [look, SOLVE_TWO, "DONE\n"], []),
                   task=two_step_task(setup_dir=setup), verifier=StepVerifier()) as r:
        t = await r.run()
        live = [sb for sb in r.backend.started if isinstance(sb, FakeSandbox)]
    obs = t.steps[2].observation
    assert "seeded" in obs  # the hook ran in the workdir before step two's first turn
    assert "answer key" not in obs  # step one's verifier files were removed
    assert t.outcome is not None and t.outcome.reward == 1.0
    assert live and live[0].files.get("/app/seed.txt") == b"seeded\n"


def test_trial_outcome_keeps_an_infra_verdict_and_drops_its_reward() -> None:
    from rollbank.episodes.outcome import EpisodeOutcome
    from rollbank.episodes.trajectory import TaskStepResult

    task = two_step_task()
    res = [TaskStepResult(0, "one", None, {}, "infra_failure", "verifier_timeout", "done", 0, 1,
                          False)]
    last = EpisodeOutcome.of(Reason.VERIFIER_TIMEOUT, loop_end="done")
    o = trial_outcome(task, res, last, "step_not_attributable_to_model")
    assert (o.outcome, o.reason, o.reward) == (Outcome.INFRA_FAILURE, Reason.VERIFIER_TIMEOUT, None)
    assert o.evidence["stopped_after"] == "one"


@pytest.mark.parametrize(("one", "gate", "reward"), [
    ([SOLVE_ONE, "DONE\n"], None, 0.5),  # step two fails: mean 0.5
    ([WRONG, "DONE\n"], 1.0, 0.0),  # early stop after step one
])
async def test_replay_reproduces_a_multi_step_episode(tmp_path: Path, one: list[str],
                                                      gate: MinReward | None,
                                                      reward: float) -> None:
    task = two_step_task(min_reward=gate)
    async with rig(per_step(one, [WRONG_TWO, "DONE\n"], []), task=task,
                   verifier=StepVerifier()) as r:
        t = await r.run()
    path = write_episode(tmp_path / "e.json", episode_record(t, task, t.meta))
    verifier = StepVerifier()
    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        report = await replay_episode(load_episode(path), task=task,
                                      source=WarmSource(pool, fake_spec(("layer-a",))),
                                      verifier=verifier, harness=FencedShellHarness())
    assert report.error is None and report.observations_match, report.to_dict()
    assert report.reward_recorded == report.reward_replayed == reward
    assert report.outcome_match and report.ok, report.to_dict()
    assert verifier.seen == [ONE, TWO][: len(t.task_steps)]  # each step verified with its view
    assert len(report.steps) == len(t.steps)


async def test_a_trace_workload_plans_each_step_and_replays_them_on_an_error_path() -> None:
    clock = FakeClock()
    w = TraceWorkload(WorkloadConfig(kind="trace", turns_median=3, turns_task_sigma=0,
                                     turns_attempt_sigma=0, tool_latency_median_s=1.0))
    verifier = StepVerifier(crash_on=TWO)  # step two's verifier fails: the experiment runs
    async with rig(lambda req: "x", backend=FakeBackend(clock, files={"/app/.keep": b""}),
                   workload=w, task=two_step_task(), verifier=verifier) as r:
        t = await r.run()
    plan = w.plan("hello", t.seed)
    assert [s.task_step for s in t.steps] == [0] * len(plan.turns) + [1] * len(plan.turns)
    assert [s.action for s in t.steps] == [f"sleep {p.tool_s:.3f}" for p in plan.turns] * 2
    o = t.outcome
    assert o is not None
    assert o.reason is Reason.VERIFIER_CRASH, o.to_dict()  # was host_error: IndexError
    assert verifier.seen == [ONE, TWO, TWO]  # the pristine fork replayed the plan and verified


async def test_each_step_gets_its_own_agent_timeout() -> None:
    clock = FakeClock()
    task = two_step_task()
    task = dataclasses.replace(task, steps=tuple(
        dataclasses.replace(s, agent_timeout_s=3.0) for s in task.steps))
    slow = "```bash\nsleep 5\n```\n"  # uses up step one's 3 s
    async with rig(per_step([slow, "DONE\n"], [SOLVE_TWO, "DONE\n"], []),
                   backend=FakeBackend(clock, files={"/app/.keep": b""}), task=task,
                   verifier=StepVerifier()) as r:
        t = await r.run()
    assert [(s.loop_end, s.reason, s.reward) for s in t.task_steps] == [
        ("budget", "budget_exhausted", 0.0), ("done", "verified_pass", 1.0)]
    assert t.steps[-2].exit_code == 0  # step two's command ran: a fresh budget
