"""``run_train`` overlaps loading the trainer with opening the planes, except where both import
the same libraries in this process (the colocated engine): there the trainer loads first.

Regression: CI saw ``rollbank train --publisher colocated`` fail with "cannot import name
'AlignDevicesHook' from partially initialized module 'accelerate.hooks'" -- the trainer's
thread and the engine's thread importing transformers/accelerate at the same time."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rollbank.episodes import sandboxes as sandboxes_mod
from rollbank.training import loop_run
from rollbank.training.loop_config import load_train_config


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, publisher: str) -> list[str]:
    events: list[str] = []
    lock = threading.Lock()

    def note(what: str) -> None:
        with lock:
            events.append(what)

    class SlowTrainer:
        def __init__(self, config: Any) -> None:
            note("trainer start")
            time.sleep(0.3)
            note("trainer done")

    @contextlib.asynccontextmanager
    async def fake_inference(config: Any, *, say: Any = None) -> AsyncIterator[str]:
        note("inference open")
        yield "plane"

    @contextlib.asynccontextmanager
    async def fake_sandboxes(*args: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "sandboxes"

    async def fake_train_with(config: Any, **kwargs: Any) -> str:
        assert kwargs["inference"] == "plane" and isinstance(kwargs["trainer"], SlowTrainer)
        return "result"

    monkeypatch.setattr(loop_run, "BuiltinTrainer", SlowTrainer)
    monkeypatch.setattr(loop_run, "open_train_inference", fake_inference)
    monkeypatch.setattr(loop_run, "train_with", fake_train_with)
    monkeypatch.setattr(sandboxes_mod, "open_sandboxes", fake_sandboxes)
    config = load_train_config(None, {
        "loop.publisher": publisher, "collect.metrics.live": "off",
        "collect.output": str(tmp_path / "run")})
    assert asyncio.run(loop_run.run_train(config)) == "result"  # type: ignore[comparison-overlap]
    return events


def test_colocated_loads_the_trainer_before_the_engine_imports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = _run(tmp_path, monkeypatch, "colocated")
    assert events == ["trainer start", "trainer done", "inference open"]


def test_other_patterns_open_servers_while_the_trainer_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = _run(tmp_path, monkeypatch, "checkpoint")
    assert events.index("inference open") < events.index("trainer done")
