"""Trainer-recompute scoring for the staleness gate in collection (``scorer = "trainer"``).

:class:`TrainerScorer` implements :class:`rollbank.scheduling.drivers.scoring.PolicyScorer` with the
trainer's own forward pass (:meth:`Trainer.logprobs`: the chunked LM head, the trainer's dtype)
over a group's trajectories, in a worker thread (a blocking forward pass never runs on the
event loop). The version is the trainer's current version, read before and after the forward
pass; if a step landed in between, the group is scored again (once), else it is reported at
the later version.

The trainer must not step while it scores: pass the ``lock`` the training loop holds around
``Trainer.step`` (a ``threading.Lock``), or score from the loop between steps.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from rollbank.batching.loader import TensorBatch
from rollbank.episodes.trajectory import Trajectory
from rollbank.scheduling.policy.scores import GroupScores

TRAINER_SCORER = "trainer_recompute"


class LogprobSource(Protocol):
    """A :class:`~rollbank.training.trainer.Trainer` (or a fake): ``[B, T]`` log-probs of the
    model tokens of a tensor batch (blocking)."""

    def logprobs(self, batch: TensorBatch) -> torch.Tensor: ...


def trajectories_tensors(trajectories: Sequence[Trajectory], *, pad_id: int = 0) -> TensorBatch:
    """Right-padded tensors of ``trajectories`` (advantages 0: scoring only)."""
    b = len(trajectories)
    t = max((len(x.token_ids) for x in trajectories), default=1)
    ids = torch.full((b, t), pad_id, dtype=torch.int64)
    attn = torch.zeros((b, t), dtype=torch.int64)
    mask = torch.zeros((b, t), dtype=torch.float32)
    old = torch.zeros((b, t), dtype=torch.float32)
    versions = torch.full((b, t), -1, dtype=torch.int32)
    for i, x in enumerate(trajectories):
        n = len(x.token_ids)
        ids[i, :n] = torch.tensor(x.token_ids, dtype=torch.int64)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(x.loss_mask, dtype=torch.float32)
        old[i, :n] = torch.tensor(x.logprobs, dtype=torch.float32)
        versions[i, :n] = torch.tensor(x.policy_versions, dtype=torch.int32)
    return TensorBatch(
        input_ids=ids, attention_mask=attn, loss_mask=mask, old_logprobs=old,
        policy_versions=versions, advantages=torch.zeros(b), rewards=torch.zeros(b),
        prompt_lens=torch.tensor([x.prompt_len for x in trajectories], dtype=torch.int64),
        group_index=torch.zeros(b, dtype=torch.int64),
        trajectory_ids=tuple(x.trajectory_id for x in trajectories),
    )


class TrainerScorer:
    """Scores a group with the trainer's recompute (see the module docstring)."""

    name = TRAINER_SCORER

    def __init__(self, trainer: LogprobSource, version: Callable[[], int], *,
                 lock: threading.Lock | None = None) -> None:
        self.trainer = trainer
        self.version = version
        self.lock = lock or threading.Lock()

    def _score_blocking(self, trajectories: Sequence[Trajectory]) -> tuple[int, list[list[float]]]:
        with self.lock:
            for _ in range(2):
                before = self.version()
                out = self.trainer.logprobs(trajectories_tensors(trajectories))
                after = self.version()
                if after == before:
                    break
        return after, [out[i, : len(x.token_ids)].tolist() for i, x in enumerate(trajectories)]

    async def score(self, trajectories: Sequence[Trajectory]) -> GroupScores:
        t0 = time.monotonic()
        version, rows = await asyncio.to_thread(self._score_blocking, trajectories)
        return GroupScores(version, {x.trajectory_id: r for x, r in zip(trajectories, rows, strict=True)},
                           self.name, time.monotonic() - t0,
                           sum(len(x.token_ids) for x in trajectories))
