"""Counterfactual attribution end to end in REAL sandboxes (bubblewrap + overlayfs + cgroups).

The real :class:`EpisodeRunner` runs a scripted model (fake inference: the model is not what
is tested) against real sandboxes forked from a warm snapshot, the task's real verifier and
the real experiment: a probe of the episode's sandbox and a re-verify on a fresh fork of the
pristine snapshot. Cases: the model's loop called by the tests, a broken environment (deleted
interpreter, wrecking commands), a frozen cgroup (an injected stall), an environment whose
verifier is slow everywhere, and leftover agent processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from rollbank.cli.main import main
from rollbank.clock import FakeClock
from rollbank.episodes.attribution import VerifierVerdict
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.harnesses import FencedShellHarness
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.replay import EpisodeRecorder, episode_filename
from rollbank.episodes.runner import EpisodeRunner, EpisodeSink
from rollbank.episodes.sandboxes import Layers, TaskVerifier, WarmSource
from rollbank.episodes.sources import Acquired, Verifier
from rollbank.episodes.trajectory import Trajectory
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.protocol import GenerateRequest
from rollbank.routing import make_router
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.pool import WarmPool
from rollbank.sandbox.protocol import Sandbox
from rollbank.scheduling.types import AttemptKey, AttemptSpec
from rollbank.tasks.config import BuilderConfig
from rollbank.tasks.loader import load_task
from rollbank.tasks.model import Task

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tasks" / "harbor-dockerfile-features"
INSTRUCTION = "Attribution probe task: do as you are told."
TOK = FakeTokenizer()


def make_task(tmp_path: Path, test_sh: str, *, timeout_s: float, services: bool = False) -> Task:
    dst = tmp_path / "task"
    shutil.copytree(FIXTURE, dst)
    (dst / "instruction.md").write_text(INSTRUCTION + "\n")
    (dst / "tests" / "test.sh").write_text(test_sh)
    (dst / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (dst / "task.toml").write_text(f"[verifier]\ntimeout_sec = {timeout_s}\n"
                                   f"[environment]\nservices = {str(services).lower()}\n")
    return load_task(dst)


def model(*turns: str) -> Callable[[GenerateRequest], str | None]:
    """Says ``turns[k]`` at turn k (k = observations seen so far)."""

    def respond(req: GenerateRequest) -> str:
        k = TOK.decode(list(req.prompt_token_ids)).split(INSTRUCTION)[-1].count("\nOutput:")
        return turns[min(k, len(turns) - 1)]

    return respond


def bash(cmd: str) -> str:
    return f"```bash\n{cmd}\n```\n"


@contextlib.asynccontextmanager
async def real_runner(task: Task, *turns: str, verifier: Verifier | None = None,
                      recorder: EpisodeSink | None = None,
                      **cfg: Any) -> AsyncIterator[EpisodeRunner]:
    _, clients = make_fake_fleet(1, responder=model(*turns, "DONE"))
    async with LocalBackend() as backend, WarmPool(backend) as pool:
        source = WarmSource(pool, Layers(BuilderConfig.model_validate({})).spec)
        yield EpisodeRunner(
            RunnerConfig(**{"health_probe_timeout_s": 2.0, "max_turns": 3} | cfg),
            tasks={task.task_id: task}, source=source, verifier=verifier or TaskVerifier(),
            harness=FencedShellHarness(), tokenizer=TOK,
            clients={c.base_url: c for c in clients},
            router=make_router("round_robin", [c.base_url for c in clients], FakeClock()),
            recorder=recorder)


async def run_one(task: Task, *turns: str, verifier: Verifier | None = None,
                  recorder: EpisodeSink | None = None, **cfg: Any) -> Trajectory:
    async with real_runner(task, *turns, verifier=verifier, recorder=recorder, **cfg) as runner:
        t = await runner.run(AttemptSpec(key=AttemptKey(0, 0, 0, "g0"), task_id=task.task_id,
                                         seed=1, group_size=1, launched_at=0.0))
    assert t.outcome is not None
    return t


FAST_TESTS = "[ -f /app/solve.sh ] && bash /app/solve.sh\necho 0 > /logs/verifier/reward.txt\n"


async def test_model_loop_called_by_the_tests_is_the_models_failure(tmp_path: Path) -> None:
    task = make_task(tmp_path, FAST_TESTS, timeout_s=4.0)
    t = await run_one(task, bash("printf 'while :; do :; done\\n' > /app/solve.sh"))
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE,
                                                      Reason.VERIFIER_TIMEOUT_MODEL_CAUSED), \
        t.outcome.to_dict()
    exp = t.outcome.evidence["experiment"]
    assert exp["episode_probe"]["state"] == "ok"
    assert exp["pristine_verify"]["error"] is None and exp["pristine_verify"]["reward"] == 0.0


async def test_replay_reproduces_the_verdict(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    task = make_task(tmp_path, FAST_TESTS, timeout_s=4.0)
    t = await run_one(task, bash("printf 'while :; do :; done\\n' > /app/solve.sh"),
                      recorder=EpisodeRecorder(tmp_path / "episodes"))
    path = tmp_path / "episodes" / episode_filename(t.trajectory_id)
    # the CLI runs its own event loop: off this test's loop
    code = await asyncio.to_thread(main, ["replay", str(path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["outcome_recorded"]["reason"] == "verifier_timeout_model_caused"
    assert report["outcome_replayed"]["reason"] == "verifier_timeout_model_caused", report
    assert report["outcome_replayed"]["experiment"]["pristine_verify"]["error"] is None
    assert report["outcome_match"] is True and code == 0, report
    code = await asyncio.to_thread(main, ["replay", str(path)])
    text = capsys.readouterr().out
    assert "outcome recorded model_failure/verifier_timeout_model_caused  replayed " \
           "model_failure/verifier_timeout_model_caused -> same verdict" in text, text


async def test_deleted_interpreter_is_the_models_failure(tmp_path: Path) -> None:
    tests = "python3 -c \"open('/logs/verifier/reward.txt', 'w').write('0')\"\n"
    task = make_task(tmp_path, tests, timeout_s=30.0)
    t = await run_one(task, bash("rm -rf /usr/lib/python3* /usr/local/lib/python3*"))
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE,
                                                      Reason.VERIFIER_BROKEN_BY_MODEL), \
        t.outcome.to_dict()
    assert t.outcome.evidence["experiment"]["pristine_verify"]["reward"] == 0.0


@pytest.mark.parametrize("cmd", ["kill -9 1", "rm -rf /usr/*", "find / -delete",
                                 "chmod -R 000 /usr"])
async def test_wrecking_commands_are_never_infra(tmp_path: Path, cmd: str) -> None:
    tests = "python3 -c \"open('/logs/verifier/reward.txt', 'w').write('0')\"\n"
    task = make_task(tmp_path, tests, timeout_s=30.0)
    t = await run_one(task, bash(cmd + " 2>/dev/null; true"), max_turns=1)
    assert t.outcome is not None
    # decided by the experiment (the pristine fork verifies/answers normally), not a pattern
    assert t.outcome.outcome is Outcome.MODEL_FAILURE, t.outcome.to_dict()
    assert t.outcome.reason is not Reason.SANDBOX_DIED


class FreezingVerifier:
    """The task's verifier; on the episode's sandbox (first call) the cgroup freezes mid-run."""

    def __init__(self, thaw_after_s: float) -> None:
        self.inner = TaskVerifier()
        self.calls = 0
        self.thaw_after_s = thaw_after_s

    async def verify(self, sandbox: Sandbox, task: Task) -> VerifierVerdict:
        self.calls += 1
        if self.calls == 1:
            assert isinstance(sandbox, LocalSandbox)
            loop = asyncio.get_running_loop()
            loop.call_later(0.3, sandbox.cgroup.freeze, True)
        return await self.inner.verify(sandbox, task)


async def test_frozen_cgroup_is_not_the_models_failure(tmp_path: Path) -> None:
    task = make_task(tmp_path, "sleep 1\necho 0 > /logs/verifier/reward.txt\n", timeout_s=6.0)
    t = await run_one(task, bash("echo hi > /app/notes.txt"), verifier=FreezingVerifier(60))
    assert t.outcome is not None
    assert t.outcome.outcome is Outcome.UNKNOWN, t.outcome.to_dict()
    exp = t.outcome.evidence["experiment"]
    assert exp["episode_probe"]["state"] == "timed_out"
    assert exp["pristine_verify"]["error"] is None


class FreezeFirst:
    """A source whose first sandbox (the episode's) freezes ``after_s`` after it is handed out."""

    name = "freeze-first"

    def __init__(self, inner: WarmSource, after_s: float) -> None:
        self.inner, self.after_s, self.handed = inner, after_s, 0

    async def acquire(self, task: Task, *, budget_s: float | None) -> Acquired:
        acq = await self.inner.acquire(task, budget_s=budget_s)
        self.handed += 1
        if self.handed == 1:
            assert isinstance(acq.sandbox, LocalSandbox)
            asyncio.get_running_loop().call_later(self.after_s, acq.sandbox.cgroup.freeze, True)
        return acq

    async def aclose(self) -> None:
        return None


async def test_step_timeout_in_a_frozen_sandbox_is_not_the_models_failure(tmp_path: Path) -> None:
    task = make_task(tmp_path, FAST_TESTS, timeout_s=30.0)
    async with real_runner(task, bash("sleep 1; sleep 1; sleep 1; sleep 1; echo done"),
                           step_timeout_s=3.0, step_timeout_ends_episode=True) as runner:
        assert isinstance(runner.source, WarmSource)
        runner.source = runner.judge.source = FreezeFirst(runner.source, after_s=0.5)
        t = await runner.run(AttemptSpec(key=AttemptKey(0, 0, 0, "g0"), task_id=task.task_id,
                                         seed=1, group_size=1, launched_at=0.0))
    assert t.outcome is not None
    assert t.outcome.outcome is Outcome.UNKNOWN, t.outcome.to_dict()
    exp = t.outcome.evidence["experiment"]
    assert exp["episode_probe"]["state"] == "timed_out"
    assert exp["pristine_probe"]["state"] == "ok"
    assert t.verify_s == 0.0  # an unresponsive sandbox is not verified


async def test_verifier_slow_everywhere_is_infra(tmp_path: Path) -> None:
    task = make_task(tmp_path, "sleep 30\necho 0 > /logs/verifier/reward.txt\n", timeout_s=2.0)
    t = await run_one(task, bash("echo hi > /app/notes.txt"))
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE,
                                                      Reason.VERIFIER_TIMEOUT), t.outcome.to_dict()
    assert t.outcome.evidence["experiment"]["pristine_verify"]["error"] == "verifier_timeout"


# (with the persistent shell, closing the shell kills its cgroup, background jobs included;
# commands run one by one leave them alive: the loophole kill_leftovers closes)
LOOP = ("setsid nohup sh -c 'while true; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; "
        "sleep 0.05; done' >/dev/null 2>&1 &")
SLOW_ZERO = "sleep 1\necho 0 > /logs/verifier/reward.txt\nsleep 2\n"


async def test_leftover_agent_processes_are_killed_before_verification(tmp_path: Path) -> None:
    # regression (issue 8, defect 7): kill_leftovers was never enabled: the loop's reward won
    task = make_task(tmp_path, SLOW_ZERO, timeout_s=30.0)
    t = await run_one(task, bash(LOOP), max_turns=1, use_shell=False)
    assert t.outcome is not None
    assert (t.outcome.reason, t.outcome.reward) == (Reason.MAX_TURNS, 0.0), t.outcome.to_dict()


async def test_a_task_declaring_services_keeps_them(tmp_path: Path) -> None:
    task = make_task(tmp_path, SLOW_ZERO, timeout_s=30.0, services=True)
    assert task.services
    t = await run_one(task, bash(LOOP), max_turns=1, use_shell=False)
    assert t.outcome is not None
    assert t.outcome.reward == 1.0, t.outcome.to_dict()
