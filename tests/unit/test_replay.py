"""Episode files and replay against the fake sandbox backend."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from episode_rig import (
    FileVerifier,
    cancel_while_closing,
    fake_spec,
    hanging_shell_close,
    make_task,
    script,
)

from rollbank.clock import FakeClock
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.harnesses import FencedShellHarness
from rollbank.episodes.replay import (
    SCHEMA,
    EpisodeRecorder,
    episode_filename,
    load_episode,
    replay_episode,
)
from rollbank.episodes.runner import EpisodeRunner
from rollbank.episodes.sandboxes import WarmSource
from rollbank.errors import InputError
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.routing.factory import make_router
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec

SOLVE = "```bash\nmkdir -p notes && cd notes && echo hello > /app/out.txt && pwd\n```\n"


async def _record(tmp_path: Path, *turns: str) -> Path:
    backend = FakeBackend(files={"/app/.keep": b""})
    _, clients = make_fake_fleet(1, responder=script(*turns))
    task = make_task()
    async with WarmPool(backend) as pool:
        runner = EpisodeRunner(
            RunnerConfig(max_turns=4), tasks={"hello": task},
            source=WarmSource(pool, fake_spec(("L1",))),
            verifier=FileVerifier(), harness=FencedShellHarness(), tokenizer=FakeTokenizer(),
            clients={c.base_url: c for c in clients},
            router=make_router("sticky", [c.base_url for c in clients], FakeClock()),
            recorder=EpisodeRecorder(tmp_path / "episodes"),
        )
        t = await runner.run(AttemptSpec(key=AttemptKey(3, 1, 0, "g3"), task_id="hello",
                                         seed=11, group_size=2, launched_at=0.0))
    path = tmp_path / "episodes" / episode_filename(t.trajectory_id)
    assert path.is_file()
    return path


async def _replay(path: Path) -> dict[str, object]:
    backend = FakeBackend(files={"/app/.keep": b""})
    task = make_task()
    async with WarmPool(backend) as pool:
        report = await replay_episode(
            load_episode(path), task=task,
            source=WarmSource(pool, fake_spec(("L1",))),
            verifier=FileVerifier(), harness=FencedShellHarness())
    assert not backend.live
    return report.to_dict()


async def test_episode_file_holds_what_reproduces_it(tmp_path: Path) -> None:
    path = await _record(tmp_path, "let me think", SOLVE, "DONE")
    rec = json.loads(path.read_text())
    assert rec["schema"] == SCHEMA
    assert (rec["task_id"], rec["task_hash"], rec["layer_hashes"], rec["seed"]) == (
        "hello", "hash-hello", ["L1"], 11)
    assert [s["action"] for s in rec["steps"]] == [None, SOLVE.split("\n")[1], None]
    assert rec["outcome"]["reason"] == "verified_pass"
    assert rec["runner"]["max_turns"] == 4 and rec["harness"] == "fenced-shell"
    assert len(rec["tokens"]["token_ids"]) == len(rec["tokens"]["loss_mask"])


async def test_replay_reproduces_observations_and_reward(tmp_path: Path) -> None:
    path = await _record(tmp_path, "let me think", SOLVE, "DONE")
    report = await _replay(path)
    assert report["ok"] is True
    assert report["steps_total"] == 3 and report["steps_matched"] == 3
    assert report["reward_recorded"] == report["reward_replayed"] == 1.0
    assert report["layer_hashes_match"] is True and report["task_hash_match"] is True


async def test_replay_reports_a_diverging_observation_and_reward(tmp_path: Path) -> None:
    path = await _record(tmp_path, SOLVE, "DONE")
    rec = json.loads(path.read_text())
    rec["steps"][0]["observation"] = rec["steps"][0]["observation"].replace("/app/notes", "/x")
    rec["outcome"]["reward"] = 0.0
    path.write_text(json.dumps(rec))
    report = await _replay(path)
    assert report["ok"] is False
    assert report["observations_match"] is False and report["reward_match"] is False
    first = report["first_mismatch"]
    assert isinstance(first, dict) and first["index"] == 0 and "/app/notes" in first["replayed"]


def test_load_episode_rejects_bad_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        load_episode(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(InputError, match="not JSON"):
        load_episode(bad)
    bad.write_text('{"schema": "other"}')
    with pytest.raises(InputError, match="schema"):
        load_episode(bad)


async def test_a_well_tagged_file_with_a_missing_or_bad_key_names_the_field(tmp_path: Path) -> None:
    # regression (issue 9): the right schema tag and a missing key gave a KeyError traceback
    path = await _record(tmp_path, SOLVE, "DONE")
    rec = json.loads(path.read_text())
    def drop(*keys: str | int) -> Callable[[dict[str, Any]], object]:
        def f(r: dict[str, Any]) -> object:
            target: Any = r
            for k in keys[:-1]:
                target = target[k]
            return target.pop(keys[-1])
        return f

    def put(value: object, *keys: str | int) -> Callable[[dict[str, Any]], object]:
        def f(r: dict[str, Any]) -> object:
            target: Any = r
            for k in keys[:-1]:
                target = target[k]
            target[keys[-1]] = value
            return None
        return f

    cases: list[tuple[Callable[[dict[str, Any]], object], str]] = [
        (drop("trajectory_id"), "trajectory_id"),
        (drop("steps", 0, "model_text"), "steps.0.model_text"),
        (put("first", "steps", 0, "index"), "steps.0.index"),
        (put("bored", "outcome", "reason"), "outcome.reason"),
        (put("infra_failure", "outcome", "outcome"), "outcome.reason"),  # reason/outcome mismatch
        (put(-1, "runner", "step_timeout_s"), "runner.step_timeout_s"),
    ]
    for mutate, field in cases:
        broken = json.loads(json.dumps(rec))
        mutate(broken)
        path.write_text(json.dumps(broken))
        with pytest.raises(InputError) as info:
            load_episode(path)
        assert info.value.field == field and info.value.file == str(path)


async def test_replay_decides_the_outcome_again(tmp_path: Path) -> None:
    path = await _record(tmp_path, SOLVE, "DONE")
    report = await _replay(path)
    assert report["outcome_recorded"] == {"outcome": "model_success", "reason": "verified_pass",
                                          "reward": 1.0}
    assert report["outcome_replayed"] == report["outcome_recorded"]
    assert report["outcome_match"] is True
    # a recorded infra verdict that the replay does not reproduce is reported, not hidden
    rec = json.loads(path.read_text())
    rec["outcome"].update(outcome="infra_failure", reason="verifier_crash")
    path.write_text(json.dumps(rec))
    report = await _replay(path)
    assert report["outcome_match"] is False and report["ok"] is False


async def test_cancelled_while_the_shell_closes_the_replay_sandbox_is_still_closed(
        tmp_path: Path) -> None:
    # As in the runner (test_runner.py, the fault soak's lingering sandbox): a replay aborted
    # while its shell is closing (a frozen shell takes seconds to go) must still close the
    # sandbox, not leave it alive until the backend closes.
    path = await _record(tmp_path, SOLVE, "DONE")
    entered, hold, hanging_close = hanging_shell_close()
    backend = FakeBackend(files={"/app/.keep": b""}, shell_close=hanging_close)
    async with WarmPool(backend) as pool:
        replay = asyncio.create_task(replay_episode(
            load_episode(path), task=make_task(), source=WarmSource(pool, fake_spec(("L1",))),
            verifier=FileVerifier(), harness=FencedShellHarness()))
        await cancel_while_closing(replay, entered)
        assert backend.started and not backend.live
        hold.set()
