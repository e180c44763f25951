"""TensorBoard and W&B sinks on the event seam, with fake writers (no extra needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.extras import MissingExtraError, require
from rollbank.metrics.scalars import EventScalars
from rollbank.metrics.tensorboard import TensorBoardSink
from rollbank.metrics.wandb import WandbSink
from rollbank.scheduling.policy.events import (
    AttemptEvent,
    AttemptFinished,
    AttemptWaste,
    BatchEvent,
    Event,
    EventKind,
    GroupEvent,
    WasteReason,
)


def _attempt(kind: EventKind, t: float, slot: int) -> AttemptEvent:
    return AttemptEvent(kind=kind, t=t, attempt_id=f"g0/s{slot}/r0", group_id="g0",
                        task_id="task", slot=slot, retry=0, seq=0)


def _finished(t: float, slot: int, reason: Reason, reward: float | None) -> AttemptFinished:
    return AttemptFinished(kind=EventKind.FINISHED, t=t, attempt_id=f"g0/s{slot}/r0",
                           group_id="g0", task_id="task", slot=slot, retry=0, seq=0,
                           outcome=EpisodeOutcome.of(reason, reward=reward), duration_s=t,
                           model_tokens=12, total_tokens=40)


def lifecycle() -> list[Event]:
    """Three launches, a pass, an infra failure (waste), a group, a batch; one still running."""
    return [
        _attempt(EventKind.LAUNCHED, 0.0, 0),
        _attempt(EventKind.LAUNCHED, 0.0, 1),
        _attempt(EventKind.LAUNCHED, 0.0, 2),
        _finished(2.0, 0, Reason.VERIFIED_PASS, 1.0),
        _finished(3.0, 1, Reason.SANDBOX_DIED, None),
        AttemptWaste(kind=EventKind.WASTE, t=3.0, attempt_id="g0/s1/r0", group_id="g0",
                     task_id="task", slot=1, retry=0, seq=0, reason=WasteReason.INFRA_FINAL,
                     held_s=3.0),
        GroupEvent(kind=EventKind.GROUP_DROPPED, t=3.0, group_id="g0", task_id="task", seq=0,
                   size=2, valid=1, zero_variance=True),
        BatchEvent(kind=EventKind.BATCH_READY, t=3.5, batch_index=0, groups=1, trajectories=1,
                   window_start=0.5, accounting={"consumed": 1}),
        BatchEvent(kind=EventKind.BATCH_READY, t=9.5, batch_index=1, groups=1, trajectories=2,
                   window_start=3.5),
    ]


def test_event_scalars_series() -> None:
    conv = EventScalars()
    points = [p for e in lifecycle() for p in conv.of(e)]
    attempt = {(p.tag, p.step): p.value for p in points if p.axis == "attempt"}
    assert attempt == {
        ("attempt/duration_s", 1): 2.0, ("attempt/model_tokens", 1): 12.0,
        ("attempt/total_tokens", 1): 40.0, ("attempt/trainable", 1): 1.0,
        ("attempt/reward", 1): 1.0,
        ("attempt/duration_s", 2): 3.0, ("attempt/model_tokens", 2): 12.0,
        ("attempt/total_tokens", 2): 40.0, ("attempt/trainable", 2): 0.0,  # no reward: none
    }
    b0 = {p.tag: p.value for p in points if p.axis == "batch" and p.step == 0}
    assert b0["batch/time_to_batch_s"] == 3.0
    assert b0["batch/in_flight"] == 1.0  # slot 2 still running
    assert b0["batch/waste_attempts"] == 1.0 and b0["batch/waste_sandbox_s"] == 3.0
    assert b0["batch/groups_dropped"] == 1.0 and b0["batch/groups_zero_variance"] == 1.0
    assert b0["batch/groups_ready"] == 0.0
    assert b0["batch/accounting/consumed"] == 1.0
    b1 = {p.tag: p.value for p in points if p.axis == "batch" and p.step == 1}
    # counts are per batch window: reset after batch 0
    assert b1["batch/waste_attempts"] == 0.0 and b1["batch/groups_dropped"] == 0.0
    assert b1["batch/trajectories"] == 2.0 and b1["batch/time_to_batch_s"] == 6.0


class FakeWriter:
    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int | None]] = []
        self.closed = False

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> None:
        self.scalars.append((tag, scalar_value, global_step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_tensorboard_sink_writes_each_point_with_its_step() -> None:
    w = FakeWriter()
    sink = TensorBoardSink(w)
    for e in lifecycle():
        sink.emit(e)
    sink.close()
    assert w.closed and sink.points == len(w.scalars)
    assert ("attempt/reward", 1.0, 1) in w.scalars
    assert ("batch/trajectories", 2.0, 1) in w.scalars


class FakeRun:
    def __init__(self) -> None:
        self.metrics: dict[str, str | None] = {}
        self.logged: list[dict[str, Any]] = []
        self.finished = False

    def define_metric(self, name: str, step_metric: str | None = None) -> None:
        self.metrics[name] = step_metric

    def log(self, data: dict[str, Any]) -> None:
        self.logged.append(data)

    def finish(self) -> None:
        self.finished = True


def test_wandb_sink_logs_each_axis_against_its_own_step() -> None:
    run = FakeRun()
    sink = WandbSink(run)
    for e in lifecycle():
        sink.emit(e)
    sink.close()
    assert run.metrics["attempt/*"] == "attempt/step" and run.metrics["batch/*"] == "batch/step"
    assert run.finished
    assert len(run.logged) == 4  # two finished attempts, two batches: one log call each
    first, _, b0, b1 = run.logged
    assert first["attempt/step"] == 1 and first["attempt/reward"] == 1.0
    assert not any(k.startswith("batch/") for k in first)
    assert b0["batch/step"] == 0 and b1["batch/step"] == 1
    assert sink.points == sum(len(d) - 1 for d in run.logged)


def test_missing_extra_names_the_install_command() -> None:
    with pytest.raises(MissingExtraError) as info:
        require("rollbank_no_such_module", "tensorboard", "the TensorBoard sink")
    assert "pip install 'rollbank[tensorboard]'" in str(info.value)
    assert isinstance(info.value, ImportError)


def test_a_broken_dependency_of_a_present_package_is_not_reported_as_a_missing_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rb_present_pkg.py").write_text("import rb_its_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as info:
        require("rb_present_pkg", "train", "x")
    assert not isinstance(info.value, MissingExtraError)
    assert info.value.name == "rb_its_missing_dependency"
