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
from typing import Any, cast

import pytest

from rollbank.episodes import sandboxes as sandboxes_mod
from rollbank.training import loop_run
from rollbank.training.loop_config import load_train_config


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, publisher: str,
         wrap: Any = None) -> list[str]:
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
        assert kwargs["inference"] == "plane"
        trainer = kwargs["trainer"]
        if wrap is not None:
            assert isinstance(trainer, Wrapped) and isinstance(trainer.inner, SlowTrainer)
        else:
            assert isinstance(trainer, SlowTrainer)
        return "result"

    class Wrapped:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

    monkeypatch.setattr(loop_run, "BuiltinTrainer", SlowTrainer)
    monkeypatch.setattr(loop_run, "open_train_inference", fake_inference)
    monkeypatch.setattr(loop_run, "train_with", fake_train_with)
    monkeypatch.setattr(sandboxes_mod, "open_sandboxes", fake_sandboxes)
    config = load_train_config(None, {
        "loop.publisher": publisher, "collect.metrics.live": "off",
        "collect.output": str(tmp_path / "run")})
    result = asyncio.run(loop_run.run_train(config, wrap_trainer=cast(Any, Wrapped) if wrap else None))
    assert result == "result"  # type: ignore[comparison-overlap]
    return events


def test_colocated_loads_the_trainer_before_the_engine_imports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = _run(tmp_path, monkeypatch, "colocated")
    assert events == ["trainer start", "trainer done", "inference open"]


def test_other_patterns_open_servers_while_the_trainer_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = _run(tmp_path, monkeypatch, "checkpoint")
    assert events.index("inference open") < events.index("trainer done")


def test_the_loop_trains_with_what_wrap_trainer_makes_of_the_built_in_trainer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The instrument seam (the learning bench's paced trainer): the wrapper gets the loaded
    trainer and the loop gets the wrapper."""
    _run(tmp_path, monkeypatch, "checkpoint", wrap=True)
