"""Counterfactual attribution end to end in REAL sandboxes (bubblewrap + overlayfs + cgroups).

The real :class:`EpisodeRunner` runs a scripted model (fake inference: the model is not what
is tested) against real sandboxes forked from a warm snapshot, the task's real verifier and
the real experiment: a probe of the episode's sandbox and a re-verify on a fresh fork of the
pristine snapshot. Cases: the model's loop called by the tests, a broken environment (deleted
interpreter, wrecking commands), a frozen cgroup (an injected stall: with billing a frozen
command is not billed, runs until ``max_host_stall_s`` and is stopped as ``host_stalled``, infra),
an environment whose verifier is slow everywhere, leftover agent processes, and a sandbox the
HOST kills mid-episode (its anchor SIGKILLed) vs one the model kills: decided by replaying the
model's actions on a pristine fork.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from rollbank.cli.main import main
from rollbank.clock import FakeClock
from rollbank.episodes.attribution import VerifierVerdict
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.counterfactual import ReplaySpec
from rollbank.episodes.harnesses import Command, FencedShellHarness
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.replay import EpisodeRecorder, episode_filename
from rollbank.episodes.runner import EpisodeRunner, EpisodeSink
from rollbank.episodes.sandboxes import Layers, TaskVerifier, WarmSource
from rollbank.episodes.sources import Acquired, Verifier
from rollbank.episodes.trajectory import Trajectory
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.fake_client import FakeInferenceClient
from rollbank.inference.protocol import GenerateRequest, GenerateResult
from rollbank.routing.factory import make_router
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.pool import WarmPool
from rollbank.sandbox.protocol import Sandbox
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec
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


#: the host stall credited to one command before it is stopped as host_stalled, in the tests
#: that freeze a sandbox (small, so that a frozen command ends quickly). Only there: on a
#: loaded host a CPU-bound command accrues PSI "full" stall too (billing credits it), and a
#: cap this small would stop the model's own loop as host_stalled.
MAX_HOST_STALL_S = 1.5


@contextlib.asynccontextmanager
async def real_runner(task: Task, *turns: str, verifier: Verifier | None = None,
                      recorder: EpisodeSink | None = None,
                      responder: Callable[[GenerateRequest], str | None] | None = None,
                      max_host_stall_s: float | None = None, max_processes: int | None = None,
                      **cfg: Any) -> AsyncIterator[EpisodeRunner]:
    _, clients = make_fake_fleet(1, responder=responder or model(*turns, "DONE"))
    sandbox_cfg = LocalSandboxConfig.model_validate(
        ({} if max_host_stall_s is None else {"max_host_stall_s": max_host_stall_s})
        | ({} if max_processes is None else {"max_processes": max_processes}))
    async with LocalBackend(sandbox_cfg) as backend, WarmPool(backend) as pool:
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
    async with real_runner(task, *turns, verifier=verifier, recorder=recorder,
                           **cfg) as runner:
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
    """The verifier runs on the task's pristine toolchain (episodes/verifier.TOOLCHAIN_PINS):
    deleting the interpreter no longer breaks it (it did before, and the experiment then
    called it verifier_broken_by_model); it scores the work instead."""
    tests = "python3 -c \"open('/logs/verifier/reward.txt', 'w').write('0')\"\n"
    task = make_task(tmp_path, tests, timeout_s=30.0)
    t = await run_one(task, bash("rm -rf /usr/lib/python3* /usr/local/lib/python3*"))
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE,
                                                      Reason.VERIFIED_FAIL), t.outcome.to_dict()
    assert t.outcome.reward == 0.0


@pytest.mark.parametrize("cmd", ["kill -9 1", "kill -9 -1", "rm -rf /usr/*", "find / -delete",
                                 "chmod -R 000 /usr", "rm -rf /usr/lib/python3*"])
async def test_wrecking_commands_are_never_infra(tmp_path: Path, cmd: str) -> None:
    tests = "python3 -c \"open('/logs/verifier/reward.txt', 'w').write('0')\"\n"
    task = make_task(tmp_path, tests, timeout_s=30.0)
    t = await run_one(task, bash(cmd + " 2>/dev/null; true"), max_turns=1)
    assert t.outcome is not None
    # decided by the experiment (the pristine fork verifies/answers normally), not a pattern
    assert t.outcome.outcome is Outcome.MODEL_FAILURE, t.outcome.to_dict()
    assert t.outcome.reason is not Reason.SANDBOX_DIED


def freeze_later(sandbox: Sandbox, after_s: float) -> asyncio.Task[None]:
    """Freeze the whole sandbox's cgroup ``after_s`` from now (the host, not the model)."""
    assert isinstance(sandbox, LocalSandbox)

    async def go() -> None:
        await asyncio.sleep(after_s)
        await sandbox.cgroup.afreeze(True)

    return asyncio.create_task(go())


class FreezingVerifier:
    """The task's verifier; on the episode's sandbox (first call) the cgroup freezes mid-run."""

    def __init__(self) -> None:
        self.inner = TaskVerifier()
        self.calls = 0
        self.freezes: list[asyncio.Task[None]] = []

    async def verify(self, sandbox: Sandbox, task: Task) -> VerifierVerdict:
        self.calls += 1
        if self.calls == 1:
            self.freezes.append(freeze_later(sandbox, 0.3))
        return await self.inner.verify(sandbox, task)


async def test_frozen_verifier_is_host_stalled_infra(tmp_path: Path) -> None:
    # a frozen verifier is not billed: it runs until max_host_stall_s, then billing stops it
    # as host_stalled: the host's doing (measured), infra, without an experiment
    task = make_task(tmp_path, "sleep 1\necho 0 > /logs/verifier/reward.txt\n", timeout_s=6.0)
    v = FreezingVerifier()
    t = await run_one(task, bash("echo hi > /app/notes.txt"), verifier=v,
                      max_host_stall_s=MAX_HOST_STALL_S)
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE,
                                                      Reason.HOST_STALLED), t.outcome.to_dict()
    assert t.outcome.evidence["verifier_error"] == "host_stalled"
    assert "experiment" not in t.outcome.evidence and v.calls == 1  # no pristine re-verify
    assert all(f.done() for f in v.freezes)


class FreezeFirst:
    """A source whose first sandbox (the episode's) freezes ``after_s`` after it is handed out."""

    name = "freeze-first"

    def __init__(self, inner: WarmSource, after_s: float) -> None:
        self.inner, self.after_s, self.handed = inner, after_s, 0
        self.first: Sandbox | None = None
        self.freezes: list[asyncio.Task[None]] = []

    async def acquire(self, task: Task, *, budget_s: float | None) -> Acquired:
        acq = await self.inner.acquire(task, budget_s=budget_s)
        self.handed += 1
        if self.handed == 1:
            self.first = acq.sandbox
            if self.after_s >= 0:
                self.freezes.append(freeze_later(acq.sandbox, self.after_s))
        return acq

    async def aclose(self) -> None:
        return None


async def test_a_step_in_a_frozen_sandbox_is_host_stalled_infra(tmp_path: Path) -> None:
    task = make_task(tmp_path, FAST_TESTS, timeout_s=30.0)
    async with real_runner(task, bash("sleep 1; sleep 1; sleep 1; sleep 1; echo done"),
                           step_timeout_s=3.0, step_timeout_ends_episode=True,
                           max_host_stall_s=MAX_HOST_STALL_S) as runner:
        assert isinstance(runner.source, WarmSource)
        runner.source = runner.judge.source = FreezeFirst(runner.source, after_s=0.5)
        t = await runner.run(AttemptSpec(key=AttemptKey(0, 0, 0, "g0"), task_id=task.task_id,
                                         seed=1, group_size=1, launched_at=0.0))
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE,
                                                      Reason.HOST_STALLED), t.outcome.to_dict()
    assert t.outcome.evidence["host_stalled"] is True
    assert t.outcome.evidence["host_stall_s"] >= MAX_HOST_STALL_S
    assert t.verify_s == 0.0  # a stalled sandbox is not verified


def killing_model(source: FreezeFirst, *turns: str) -> Callable[[GenerateRequest], str | None]:
    """Says ``turns`` in order; before the last one the HOST SIGKILLs the episode sandbox's
    anchor (what a runtime crash or the host's OOM killer does)."""
    inner = model(*turns, "DONE")

    def respond(req: GenerateRequest) -> str | None:
        k = TOK.decode(list(req.prompt_token_ids)).split(INSTRUCTION)[-1].count("\nOutput:")
        if k == len(turns) - 1:
            assert isinstance(source.first, LocalSandbox)
            with contextlib.suppress(ProcessLookupError):
                os.kill(source.first.anchor_pid, signal.SIGKILL)
        return inner(req)

    return respond


async def test_a_host_killed_sandbox_is_infra(tmp_path: Path) -> None:
    # regression: was model_failure/sandbox_wrecked (the sandbox died, a pristine fork answers)
    task = make_task(tmp_path, FAST_TESTS, timeout_s=30.0)
    turns = (bash("echo hi > /app/notes.txt"), bash("ls /app; cat /app/notes.txt"),
             bash("echo more >> /app/notes.txt"))
    holder: list[FreezeFirst] = []
    async with real_runner(task, responder=lambda r: killing_model(holder[0], *turns)(r),
                           max_turns=4) as runner:
        assert isinstance(runner.source, WarmSource)
        holder.append(FreezeFirst(runner.source, after_s=-1))  # records the episode's sandbox
        runner.source = runner.judge.source = holder[0]
        t = await runner.run(AttemptSpec(key=AttemptKey(0, 0, 0, "g0"), task_id=task.task_id,
                                         seed=1, group_size=1, launched_at=0.0))
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE,
                                                      Reason.SANDBOX_DIED), t.outcome.to_dict()
    exp = t.outcome.evidence["experiment"]
    assert exp["episode_probe"]["state"] == "dead" and exp["pristine_probe"]["state"] == "ok"
    assert exp["replay"]["state"] == "healthy"
    assert [s["index"] for s in exp["replay"]["steps"]] == [0, 1, 2]


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


SERVICE_ALIVE = ("if ps -eo args | grep -v grep | grep -q 'while true'; then echo 1; else echo 0;"
                 " fi > /logs/verifier/reward.txt\n")


async def test_a_task_declaring_services_keeps_them(tmp_path: Path) -> None:
    """The agent's processes are alive during verification (the tests can talk to them);
    they can no longer write the verifier's reward (its /logs/verifier is private), so the
    tests observe the process itself."""
    task = make_task(tmp_path, SERVICE_ALIVE, timeout_s=30.0, services=True)
    assert task.services
    t = await run_one(task, bash(LOOP), max_turns=1, use_shell=False)
    assert t.outcome is not None
    assert t.outcome.reward == 1.0, t.outcome.to_dict()


# What breaks a sandbox here (measured): the runtime survives every command the model can run
# (``kill -9 1`` / ``kill -9 -1`` / ``kill -9 $$`` leave it answering, the shell session
# respawns); ``rm -rf /usr/*``, ``find / -delete`` and ``chmod -R 000 /usr`` leave it answering
# the probe with a failure (no /bin/sh, no /app, permission denied).
@pytest.mark.parametrize(("cmd", "breaks"), [("rm -rf /usr/*", True), ("find / -delete", True),
                                             ("chmod -R 000 /usr", True), ("kill -9 -1", False),
                                             ("kill -9 1", False)])
async def test_the_replay_reproduces_what_breaks_a_sandbox(tmp_path: Path, cmd: str,
                                                           breaks: bool) -> None:
    task = make_task(tmp_path, FAST_TESTS, timeout_s=30.0)
    spec = ReplaySpec(((Command("echo hi > /app/notes.txt"),), (),
                       (Command(cmd + " 2>/dev/null; true"),), (Command("ls /app"),)),
                      step_timeout_s=30.0, budget_s=120.0)
    async with real_runner(task) as runner:
        ev = await runner.judge.replay(task, spec)
    if breaks:
        assert (ev.state.value, ev.broke_after) == ("reproduced", 2), ev
        assert ev.fork_probe is not None and ev.fork_probe.state.value == "failed"
        assert [s["index"] for s in ev.steps] == [0, 2]
    else:
        assert ev.state.value == "healthy", ev
        assert [s["index"] for s in ev.steps] == [0, 2, 3] and ev.steps_total == 3


async def test_a_sandbox_the_model_broke_is_the_models_even_if_it_then_dies(tmp_path: Path) -> None:
    # the model wrecks its sandbox, then the runtime dies: the replay reproduces the breakage
    task = make_task(tmp_path, FAST_TESTS, timeout_s=30.0)
    turns = (bash("chmod -R 000 /usr 2>/dev/null; true"), bash("ls /app"))
    holder: list[FreezeFirst] = []
    async with real_runner(task, responder=lambda r: killing_model(holder[0], *turns)(r),
                           max_turns=4) as runner:
        assert isinstance(runner.source, WarmSource)
        holder.append(FreezeFirst(runner.source, after_s=-1))
        runner.source = runner.judge.source = holder[0]
        t = await runner.run(AttemptSpec(key=AttemptKey(0, 0, 0, "g0"), task_id=task.task_id,
                                         seed=1, group_size=1, launched_at=0.0))
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE,
                                                      Reason.SANDBOX_WRECKED), t.outcome.to_dict()
    replay = t.outcome.evidence["experiment"]["replay"]
    assert (replay["state"], replay["broke_after"]) == ("reproduced", 0), replay
    assert replay["fork_probe"]["state"] == "failed"


#: what a fork bomb left in the background does, made deterministic: every pid slot the
#: sandbox's limit allows is taken, and one a process frees is taken again (a bomb churns:
#: the next command may or may not find a free slot)
PID_HOG = ("perl -e 'for (;;) { my $p = fork; if (!defined $p) { select(undef, undef, undef, "
           "0.005); next } if (!$p) { sleep 600; exit } }'")
#: the hog, started 2 s later: a replay of the model's actions (back to back, no model
#: thinking time) is over before it starts, so only the kernel's counter can tell
LATE_HOG = f"(sleep 2; exec {PID_HOG}) >/dev/null 2>&1 &"


class ThinkingClient(FakeInferenceClient):
    """The fake model, thinking before each turn after the first until ``ready()`` (polled
    with asyncio sleeps; bound 15 s)."""

    def __init__(self, inner: FakeInferenceClient, ready: Callable[[], bool]) -> None:
        super().__init__(inner.server)
        self.ready, self.turns = ready, 0

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        for _ in range(1500 if self.turns else 0):
            if self.ready():
                break
            await asyncio.sleep(0.01)
        self.turns += 1
        return await super().generate(request)


@pytest.mark.parametrize("services", [False, True])
async def test_a_background_fork_bomb_is_the_models_failure(tmp_path: Path, services: bool) -> None:
    """Regression: the model's background processes took every pid of its sandbox, so
    rb-helper could not fork the next command ("rb-helper: fork: EAGAIN"), raised as a
    SandboxError: the sandbox "died", and the replay of the model's actions on a pristine
    fork (over before the late hog starts) left it healthy: infra_failure/sandbox_died. The
    kernel counted the refusal in the sandbox's pids.events: the command's result (exit 126,
    pids_limit_hit) and the episode is the model's."""
    limit = 24
    task = make_task(tmp_path, FAST_TESTS, timeout_s=30.0, services=services)
    async with real_runner(task, bash(LATE_HOG), bash("echo hi"), bash("echo again"),
                           max_turns=4, use_shell=False, max_processes=limit) as runner:
        assert isinstance(runner.source, WarmSource)
        source = runner.source = runner.judge.source = FreezeFirst(runner.source, after_s=-1)

        def full() -> bool:  # the model's processes hold its sandbox's whole pid limit
            return isinstance(source.first, LocalSandbox) and len(source.first.cgroup.pids()) >= limit

        runner.clients = {url: ThinkingClient(c, full) for url, c in runner.clients.items()
                          if isinstance(c, FakeInferenceClient)}
        t = await runner.run(AttemptSpec(key=AttemptKey(0, 0, 0, "g0"), task_id=task.task_id,
                                         seed=1, group_size=1, launched_at=0.0))
        sb = source.first
    assert t.outcome is not None
    # the pinned verifier keeps the agent's processes (as under Harbor), services or not:
    # the verifier cannot start, and the experiment finds the episode's sandbox refusing
    # commands at its pids limit while a pristine fork verifies normally
    want = Reason.PIDS_EXCEEDED
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE, want), \
        t.outcome.to_dict()
    if want is Reason.PIDS_EXCEEDED:
        exp = t.outcome.evidence["experiment"]
        assert exp["pristine_verify"]["error"] is None and exp["replay"] is None
        assert exp["episode_probe"]["state"] == "failed"
    assert [s.exit_code for s in t.steps[1:3]] == [126, 126], [s.observation for s in t.steps]
    assert "hold every pid" in t.steps[1].observation
    assert t.outcome.evidence["pids_limit_hits"] > 0
    assert isinstance(sb, LocalSandbox) and not sb.alive  # closed: nothing of it is left
    assert not any(p.exists() for p in [*sb.cgroup.v1.values(), sb.cgroup.v2] if p is not None)
