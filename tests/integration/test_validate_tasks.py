"""`rollbank tasks validate` and the verifier end to end, in REAL local sandboxes.

Fixture tasks are built for real, their oracle and a no-op agent run in fresh bubblewrap
sandboxes, and verifier faults (crash, timeout, missing reward) are provoked for real.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollbank.cli.main import main
from rollbank.episodes.outcome import Outcome
from rollbank.episodes.validate import load_baseline, spec_for, validate_task, validate_tasks
from rollbank.episodes.verifier import VerifierStatus, run_verifier, verifier_outcome
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.tasks.builder import EnvironmentBuilder
from rollbank.tasks.loader import load_task, load_tasks
from rollbank.tasks.model import Task

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parents[1] / "fixtures"
SHARED_EXAMPLES = Path(__file__).parents[3] / "shared" / "examples"


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    async with LocalBackend() as b:
        yield b


async def test_fixture_tasks_validate(backend: LocalBackend) -> None:
    tasks = load_tasks([FIXTURES / "tasks"])
    results = await validate_tasks(tasks, backend, EnvironmentBuilder(), jobs=2)
    for r in results:
        assert r.ok, r.to_dict()
        assert (r.oracle_reward, r.noop_reward) == (1.0, 0.0)
        assert (r.oracle_status, r.noop_status) == ("pass", "fail")
        assert set(r.timings) == {"build_s", "oracle_s", "noop_s"}
    assert {r.format for r in results} == {"harbor", "terminal-bench-1"}


def test_cli_validate_json_on_a_task_folder(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tasks", "validate", str(FIXTURES / "tasks" / "tbench-count-words"), "--json"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert code == 0
    assert len(lines) == 1 and lines[0]["task_id"] == "tbench-count-words"
    assert lines[0]["ok"] is True and lines[0]["error"] is None
    assert lines[0]["oracle_reward"] == 1.0 and lines[0]["noop_reward"] == 0.0


def test_cli_validate_fails_on_a_broken_build(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tasks", "validate", str(FIXTURES / "tasks-malformed" / "failing-run"), "--json"])
    (line,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert code == 1 and line["ok"] is False
    assert "failing-run/environment/Dockerfile:3" in line["error"]


def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "list", str(FIXTURES / "tasks"), "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    by_id = {r["id"]: r for r in rows}
    assert by_id["harbor-registry-build"]["cost"] == "expensive"
    assert by_id["tbench-count-words"]["format"] == "terminal-bench-1"
    assert all(len(r["hash"]) == 12 for r in rows)


@pytest.mark.skipif(not SHARED_EXAMPLES.is_dir(), reason="../shared/examples is not on this machine")
def test_shared_examples_validate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "validate", str(SHARED_EXAMPLES), "--json"]) == 0
    assert all(json.loads(x)["ok"] for x in capsys.readouterr().out.splitlines())


# --------------------------------------------------------------- verifier faults, for real
def task_with_test(tmp_path: Path, test_sh: str, *, timeout_s: float = 60.0) -> Task:
    dst = tmp_path / "task"
    shutil.copytree(FIXTURES / "tasks" / "harbor-dockerfile-features", dst)
    (dst / "tests" / "test.sh").write_text(test_sh)
    (dst / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (dst / "task.toml").write_text(f'[verifier]\ntimeout_sec = {timeout_s}\n')
    return load_task(dst)


async def verify(backend: LocalBackend, task: Task, agent: str | None = None) -> VerifierStatus:
    built = await asyncio.to_thread(EnvironmentBuilder().build, task)  # it blocks: off the loop
    sb = await backend.start(spec_for(task, built))
    try:
        if agent is not None:
            res = await sb.exec(["/bin/bash", "-c", agent], timeout_s=30)
            assert res.exit_code == 0, res.stderr
        return (await run_verifier(sb, task)).status
    finally:
        await sb.close()


@pytest.mark.parametrize(
    ("test_sh", "status"),
    [
        ("exec /nonexistent/python3 /tests/x.py\n", VerifierStatus.CRASH),
        ("echo tests ran but wrote nothing\n", VerifierStatus.NO_REWARD),
        ("echo '{\"a\": 1, \"b\": 1}' > /logs/verifier/reward.json\n", VerifierStatus.PASS),
        ("echo '{\"a\": 1, \"b\": 0}' > /logs/verifier/reward.json\n", VerifierStatus.FAIL),
        ("echo garbage > /logs/verifier/reward.txt\n", VerifierStatus.CRASH),
        # a verifier dependency missing offline is infra, even though the script writes 0
        ("uvx -w rollbank-no-such-package==1.0 pytest /tests || echo 0 > /logs/verifier/reward.txt\n",
         VerifierStatus.CRASH),
        ("apt-get install -y rollbank-no-such-package || echo 0 > /logs/verifier/reward.txt\n",
         VerifierStatus.CRASH),
    ],
)
async def test_verifier_statuses(backend: LocalBackend, tmp_path: Path, test_sh: str,
                                 status: VerifierStatus) -> None:
    assert await verify(backend, task_with_test(tmp_path, test_sh)) is status


async def test_verifier_timeout_is_infra(backend: LocalBackend, tmp_path: Path) -> None:
    task = task_with_test(tmp_path, "sleep 600\necho 1 > /logs/verifier/reward.txt\n", timeout_s=1.0)
    built = await asyncio.to_thread(EnvironmentBuilder().build, task)  # it blocks: off the loop
    sb = await backend.start(spec_for(task, built))
    try:
        result = await run_verifier(sb, task)
    finally:
        await sb.close()
    assert result.status is VerifierStatus.TIMEOUT
    assert verifier_outcome(result).outcome is Outcome.INFRA_FAILURE


async def test_agent_cannot_plant_tests_or_rewards(backend: LocalBackend, tmp_path: Path) -> None:
    task = task_with_test(tmp_path, "echo 0 > /logs/verifier/reward.txt\n")
    agent = ("mkdir -p /tests /logs/verifier && echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh"
             " && echo 1 > /logs/verifier/reward.txt")
    assert await verify(backend, task, agent) is VerifierStatus.FAIL


async def test_agent_symlinked_logs_are_replaced(backend: LocalBackend, tmp_path: Path) -> None:
    task = task_with_test(tmp_path, "echo 0 > /logs/verifier/reward.txt\n")
    agent = ("mkdir -p /tmp/fake/verifier && echo 1 > /tmp/fake/verifier/reward.txt && "
             "rm -rf /logs && ln -s /tmp/fake /logs")
    assert await verify(backend, task, agent) is VerifierStatus.FAIL


async def test_kill_leftovers_stops_a_reward_rewriting_loop(backend: LocalBackend, tmp_path: Path) -> None:
    task = task_with_test(tmp_path, "sleep 1; echo 0 > /logs/verifier/reward.txt; sleep 2\n")
    built = await asyncio.to_thread(EnvironmentBuilder().build, task)  # it blocks: off the loop
    sb = await backend.start(spec_for(task, built))
    try:
        loop = "nohup sh -c 'while true; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.05; done' >/dev/null 2>&1 &"
        assert (await sb.exec(["/bin/bash", "-c", loop], timeout_s=10)).exit_code == 0
        result = await run_verifier(sb, task, kill_leftovers=True)
        assert sb.alive
    finally:
        await sb.close()
    assert result.status is VerifierStatus.FAIL


async def test_validate_records_the_verifier_baseline(backend: LocalBackend, tmp_path: Path) -> None:
    task = task_with_test(tmp_path, "if [ -f /app/solved ]; then echo 1; else echo 0; fi"
                                    " > /logs/verifier/reward.txt\n", timeout_s=30.0)
    (task.path / "solution" / "solve.sh").write_text("touch /app/solved\n")
    task = load_task(task.path)
    rec = await validate_task(task, backend, EnvironmentBuilder(), baseline_dir=tmp_path / "b")
    assert rec.ok, rec.to_dict()
    assert set(rec.verify_timings) == {"oracle_verify_s", "noop_verify_s"}
    b = load_baseline(task.content_hash, tmp_path / "b")
    assert b is not None and b.content_hash == task.content_hash
    assert (b.noop_verify_s, b.verifier_timeout_s) == (rec.verify_timings["noop_verify_s"], 30.0)
