"""A Harbor 1.1 multi-step task run by the real EpisodeRunner in REAL sandboxes.

The ``multi-step-notes`` fixture (two steps, step 1 gated by ``min_reward = 1``, step 2 with
its own tests and a ``workdir/setup.sh`` hook) is built for real; a scripted model (fake
inference: the model is not what is tested) types each step's oracle commands through the
fenced-shell harness; the task's real verifier checks each step in the same sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from rollbank.cli.main import main
from rollbank.clock import FakeClock
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.harnesses import FencedShellHarness
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.replay import EpisodeRecorder, episode_filename, load_episode
from rollbank.episodes.runner import EpisodeRunner
from rollbank.episodes.sandboxes import Layers, TaskVerifier, WarmSource
from rollbank.episodes.trajectory import Trajectory
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.protocol import GenerateRequest
from rollbank.routing.factory import make_router
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.pool import WarmPool
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec
from rollbank.tasks.config import BuilderConfig
from rollbank.tasks.loader import load_task

pytestmark = pytest.mark.integration

TASK = Path(__file__).parents[1] / "fixtures" / "harbor-real" / "multi-step-notes"
TOK = FakeTokenizer()


def bash(cmd: str) -> str:
    return f"```bash\n{cmd}\n```\n"


def per_step(script: dict[str, list[str]], prompts: list[str]) -> Callable[[GenerateRequest], str]:
    """At turn k of a step, says ``script[start of the step's instruction][k]``."""

    def respond(req: GenerateRequest) -> str:
        prompt = TOK.decode(list(req.prompt_token_ids))
        prompts.append(prompt)
        current = prompt.rsplit("\nTask: ", 1)[-1]
        turns = next(t for key, t in script.items() if current.startswith(key))
        return turns[min(current.count("\nOutput:"), len(turns) - 1)]

    return respond


@contextlib.asynccontextmanager
async def runner(script: dict[str, list[str]], prompts: list[str],
                 episodes: Path) -> AsyncIterator[EpisodeRunner]:
    task = load_task(TASK)
    _, clients = make_fake_fleet(1, responder=per_step(script, prompts))
    async with LocalBackend() as backend, WarmPool(backend) as pool:
        source = WarmSource(pool, Layers(BuilderConfig.model_validate({})).spec)
        yield EpisodeRunner(
            RunnerConfig(health_probe_timeout_s=5.0, max_turns=4),
            tasks={task.task_id: task}, source=source, verifier=TaskVerifier(),
            harness=FencedShellHarness(), tokenizer=TOK,
            clients={c.base_url: c for c in clients},
            router=make_router("round_robin", [c.base_url for c in clients], FakeClock()),
            recorder=EpisodeRecorder(episodes))


async def run(script: dict[str, list[str]], prompts: list[str], episodes: Path) -> Trajectory:
    async with runner(script, prompts, episodes) as r:
        return await r.run(AttemptSpec(key=AttemptKey(0, 0, 0, "g0"), task_id=TASK.name, seed=1,
                                       group_size=1, launched_at=0.0))


CREATE = "Create the file `/app/notes.txt`"
APPEND = "Append a second line `beta`"


async def test_oracle_commands_pass_both_steps(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    prompts: list[str] = []
    look = bash("cat .step2-setup; ls /tests /logs/verifier 2>&1 | head -5")
    t = await run({CREATE: [bash("echo alpha > /app/notes.txt"), "DONE\n"],
                   APPEND: [look, bash("echo beta >> /app/notes.txt"), "DONE\n"]},
                  prompts, tmp_path)
    o = t.outcome
    assert o is not None
    assert [(s.name, s.reward, s.reason) for s in t.task_steps] == [
        ("01-create", 1.0, "verified_pass"), ("02-append", 1.0, "verified_pass")], o.to_dict()
    assert (o.outcome, o.reason, o.reward) == (Outcome.MODEL_SUCCESS, Reason.VERIFIED_PASS, 1.0)
    assert o.rewards == {"01-create": 1.0, "02-append": 1.0}
    # step 2's setup hook ran in /app before its first turn; step 1's tests were cleared
    seen = t.steps[2].observation
    assert "ready" in seen and "check.sh" not in seen, seen
    assert [s.task_step for s in t.steps] == [0, 0, 1, 1, 1]
    path = tmp_path / episode_filename(t.trajectory_id)
    rec = load_episode(path)
    assert [(e.name, e.reward) for e in rec.task_steps] == [("01-create", 1.0), ("02-append", 1.0)]
    # replay re-runs each step's turns and verifier in a fresh sandbox: same verdict
    code = await asyncio.to_thread(main, ["replay", str(path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["outcome_replayed"]["reason"] == "verified_pass", report
    assert report["reward_replayed"] == 1.0 and report["ok"] is True and code == 0, report


async def test_a_failed_gated_step_stops_the_trial(tmp_path: Path) -> None:
    prompts: list[str] = []
    t = await run({CREATE: [bash("echo gamma > /app/notes.txt"), "DONE\n"],
                   APPEND: [bash("echo beta >> /app/notes.txt"), "DONE\n"]},
                  prompts, tmp_path)
    o = t.outcome
    assert o is not None
    assert not any(APPEND in p for p in prompts)  # step 2 never prompted
    assert [(s.name, s.reward) for s in t.task_steps] == [("01-create", 0.0)]
    assert (o.outcome, o.reason, o.reward) == (Outcome.MODEL_FAILURE, Reason.VERIFIED_FAIL, 0.0)
    assert o.evidence["stopped_after"] == "01-create"
