"""The scorers behind the PolicyScorer seam, with fakes: the engine scorer's version checks
and admission wait, the trainer scorer's tensors and version."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from rollbank.episodes.trajectory import Trajectory
from rollbank.errors import ServerUnreachableError
from rollbank.inference.protocol import AdmissionGate
from rollbank.scheduling.drivers.scoring import EngineScorer


def _traj(tid: str, n_model: int = 3) -> Trajectory:
    t = Trajectory(trajectory_id=tid, group_id="g", task_id="t", attempt=0)
    t.append_prompt([5, 6])
    t.prompt_len = 2
    t.append_model(list(range(40, 40 + n_model)), [-1.0] * n_model, 0)
    return t


class FakeEngine:
    """Scores token t as ``-t / 100``; ``versions`` is the sequence of versions that
    ``engine_version`` reports (the last one repeats)."""

    def __init__(self, versions: list[int], fail_on: Callable[[list[int]], bool] = lambda _: False
                 ) -> None:
        self.versions = versions
        self.fail_on = fail_on
        self.gate = AdmissionGate()
        self.scored: list[str] = []

    @property
    def admission(self) -> AdmissionGate:
        return self.gate

    async def engine_version(self, request_id: str | None = None) -> int:
        return self.versions.pop(0) if len(self.versions) > 1 else self.versions[0]

    async def prompt_logprobs(self, token_ids: list[int], *, request_id: str) -> list[float]:
        self.scored.append(request_id)
        if self.fail_on(token_ids):
            raise ServerUnreachableError("gone", request_id=request_id)
        return [0.0, *(-t / 100 for t in token_ids[1:])]


async def test_engine_scorer_reports_the_version_and_the_prompt_logprobs() -> None:
    engine = FakeEngine([4])
    scores = await EngineScorer([engine]).score([_traj("a"), _traj("b")])
    assert scores.version == 4 and scores.scorer == "engine_prompt_logprobs"
    assert scores.logprobs["a"] == [0.0, -0.06, -0.4, -0.41, -0.42]
    assert scores.tokens == 10 and not scores.errors


async def test_a_publication_during_scoring_scores_again_at_the_new_version() -> None:
    engine = FakeEngine([1, 2, 2, 2])  # before 1, after 2: ambiguous; then 2 / 2
    scores = await EngineScorer([engine]).score([_traj("a"), _traj("b")])
    assert scores.version == 2 and scores.logprobs["a"] is not None
    assert engine.scored == ["score-a", "score-b", "score-a", "score-b"]


async def test_engines_that_disagree_on_the_version_are_scored_again() -> None:
    old, new = FakeEngine([1, 1, 2]), FakeEngine([2])  # the first engine catches up
    scores = await EngineScorer([old, new]).score([_traj("a"), _traj("b")])
    assert scores.version == 2 and old.scored == ["score-a", "score-a"]
    assert new.scored == ["score-b", "score-b"]


async def test_a_version_moving_on_every_try_leaves_the_sequence_unmeasured() -> None:
    engine = FakeEngine(list(range(20)))
    scores = await EngineScorer([engine], version_retries=1).score([_traj("a")])
    assert scores.logprobs["a"] is None and "version changed" in scores.errors["a"]
    assert scores.version == -1


async def test_one_failed_sequence_is_unmeasured_the_others_are_scored() -> None:
    engine = FakeEngine([0], fail_on=lambda ids: len(ids) == 6)
    scores = await EngineScorer([engine]).score([_traj("a"), _traj("b", 4)])
    assert scores.logprobs["a"] is not None and scores.logprobs["b"] is None
    assert scores.errors["b"].startswith("ServerUnreachableError")


async def test_scoring_waits_for_the_admission_gate() -> None:
    engine = FakeEngine([0])
    engine.gate.close()
    task = asyncio.create_task(EngineScorer([engine]).score([_traj("a")]))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not engine.scored and not task.done()
    engine.gate.open()
    assert (await task).logprobs["a"] is not None


def test_trainer_scorer_scores_the_trajectories_tensors_at_the_trainers_version() -> None:
    import torch

    from rollbank.batching.loader import TensorBatch
    from rollbank.training.scorer import TrainerScorer

    seen: list[TensorBatch] = []
    version = iter([3, 4, 4, 4])  # a step lands during the first pass: scored again

    class Fake:
        def logprobs(self, batch: TensorBatch) -> torch.Tensor:
            seen.append(batch)
            return -batch.input_ids.float() * batch.loss_mask / 100

    scorer = TrainerScorer(Fake(), lambda: next(version))
    scores = asyncio.run(scorer.score([_traj("a", 2), _traj("b", 4)]))
    assert scores.version == 4 and len(seen) == 2
    assert scores.logprobs["a"] == pytest.approx([0.0, 0.0, -0.4, -0.41])
    assert len(scores.logprobs["b"] or []) == 6
    assert seen[0].input_ids.shape == (2, 6) and seen[0].attention_mask[0].tolist() == [1] * 4 + [0] * 2
