"""The pacing instrument (``--trainer-step-s``): each step lasts at least the pace, the update
is the inner trainer's, and a zero pace leaves the loop's trainer as it is."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rollbank_bench.learning.paced_trainer import PacedTrainer
from rollbank_bench.learning.real_loop import paced


class _Inner:
    def __init__(self, now: list[float], step_s: float) -> None:
        self.now, self.step_s, self.calls = now, step_s, 0

    def train(self, batch: Any) -> dict[str, float]:
        self.calls += 1
        self.now[0] += self.step_s
        return {"loss": 0.5}

    def save(self, root: Path, version: int) -> Path:
        return root / f"v{version}"

    def tensors(self) -> Mapping[str, Any]:
        return {"w": 1}


def _paced(real_step_s: float, pace_s: float) -> tuple[PacedTrainer, _Inner, list[float]]:
    now = [0.0]
    inner = _Inner(now, real_step_s)

    def sleep(s: float) -> None:
        now[0] += s

    return PacedTrainer(inner, pace_s, clock=lambda: now[0], sleep=sleep), inner, now


def test_a_fast_step_is_paced_to_the_floor_and_keeps_the_inner_result() -> None:
    t, inner, now = _paced(0.4, 3.0)
    assert t.train(object()) == {"loss": 0.5}  # type: ignore[arg-type]
    assert now[0] == pytest.approx(3.0) and t.paced_s == pytest.approx(2.6)
    assert t.save(Path("/w"), 2) == Path("/w/v2") and t.tensors() == {"w": 1}
    assert inner.calls == 1


def test_a_slower_step_than_the_pace_is_not_slept_on() -> None:
    t, _, now = _paced(5.0, 3.0)
    t.train(object())  # type: ignore[arg-type]
    assert now[0] == pytest.approx(5.0) and t.paced_s == 0.0


def test_the_flag_wraps_only_when_set() -> None:
    assert paced(argparse.Namespace(trainer_step_s=0.0)) is None
    wrap = paced(argparse.Namespace(trainer_step_s=2.0))
    assert wrap is not None
    t = wrap(_Inner([0.0], 0.1))
    assert isinstance(t, PacedTrainer) and t.step_s == 2.0
    with pytest.raises(ValueError, match="step_s"):
        PacedTrainer(_Inner([0.0], 0.1), -1.0)
