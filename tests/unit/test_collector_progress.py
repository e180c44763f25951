"""The collector's progress wiring: plain lines on a non-terminal stderr, the end summary, the
zero-variance share in summary.json; and the embedded default's task choice."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from episode_rig import FileVerifier, fake_spec, make_task
from test_collector import TOK, config, model

from rollbank.collect_config import load_collect_config
from rollbank.collector import collect, enter_concurrently
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import SandboxPlane
from rollbank.errors import ConfigError
from rollbank.inference.fake import make_fake_fleet
from rollbank.inference_plane import InferencePlane
from rollbank.metrics.bound import Capacity
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool
from rollbank.task_selection import select_tasks


async def test_non_tty_run_prints_plain_progress_and_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, clients = make_fake_fleet(2, responder=model)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    cap = Capacity(100.0, 400.0, 1000.0, 4000.0, sandbox_slots=4)
    cfg = config().model_copy(update={"metrics": config().metrics.model_copy(update={"live": "auto"})})
    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        result = await collect(cfg, tasks=[make_task()], inference=plane,
                               sandboxes=SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier()),
                               out_dir=tmp_path / "run", capacity=cap, setup_s=1.5)
    err = capsys.readouterr().err
    assert "[rollbank] batch 0: groups 1/2" in err and "[rollbank] batch 1: groups 1/2" in err
    assert f"[rollbank] batch 0 written to {tmp_path / 'run' / 'batches' / 'batch-000000'}" in err
    assert "run finished: 2 batch(es)" in err
    assert "4/4 groups with reward variance (100%)" in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["zero_variance_share"] == 0.0
    assert all(b["extra"]["zero_variance_groups"] == 0 for b in summary["batches"])
    assert result.batches[0].extra["zero_variance_share"] == 0.0


def test_embedded_default_runs_the_very_easy_tasks_on_an_auto_host_plan() -> None:
    c = load_collect_config()
    tasks = select_tasks(c)
    assert len(tasks) >= 2 and all("very-easy" in t.tags for t in tasks)  # measured 0 < p < 1
    m = c.inference.managed
    assert (m.num_servers, m.dtype, m.threads) == ("auto", "auto", "auto")
    # one observation (bytes >= tokens) must leave room in the context: a 10 kB `cat` ended
    # count-lines episodes after their first step at max_model_len 2048
    assert c.fenced_shell.observation_limit_bytes <= c.runner.max_model_len // 2


class Probe:
    """An async context manager that records its life and can be told to fail on entry."""

    def __init__(self, name: str, log: list[str], gate: asyncio.Event, *, fail: bool = False,
                 wait: bool = True) -> None:
        self.name, self.log, self.gate, self.fail, self.wait = name, log, gate, fail, wait

    async def __aenter__(self) -> str:
        self.log.append(f"{self.name} entering")
        try:
            if self.wait:
                await self.gate.wait()
            else:
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.log.append(f"{self.name} cancelled")
            raise
        if self.fail:
            raise ConfigError(f"{self.name} failed")
        self.gate.set()
        self.log.append(f"{self.name} in")
        return self.name

    async def __aexit__(self, *exc: object) -> None:
        self.log.append(f"{self.name} exited")


async def test_enter_concurrently_starts_both_before_either_finishes() -> None:
    log: list[str] = []
    gate = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        # "a" waits for the gate that "b" opens: sequential entry would deadlock
        got = await asyncio.wait_for(enter_concurrently(
            stack, Probe("a", log, gate), Probe("b", log, gate, wait=False)), timeout=30)
        assert got == ["a", "b"]
    assert log[:2] == ["a entering", "b entering"]
    assert log[-2:] == ["b exited", "a exited"]  # exited in reverse order


async def test_enter_concurrently_cancels_the_other_when_one_fails() -> None:
    log: list[str] = []
    gate = asyncio.Event()
    stack = contextlib.AsyncExitStack()
    with pytest.raises(ConfigError, match="b failed"):
        await enter_concurrently(stack, Probe("a", log, gate), Probe("b", log, gate, fail=True, wait=False))
    await stack.aclose()
    assert "a cancelled" in log and "a exited" not in log and "b exited" not in log
