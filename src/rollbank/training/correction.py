"""Staleness corrections in the built-in trainer, and "trainer recompute" scoring.

Two jobs (issue #11, items 1 and 3):

- :func:`loss_inputs`: the effective loss mask and per-token weights of one optimizer step
  from a schema-v2 :class:`~rollbank.batching.loader.TensorBatch` (``is_weights``,
  ``is_keep``, ``gate_weight``) and :class:`~rollbank.training.config.TrainerConfig`
  (``correction``, ``ratio_against``); the rules are in :mod:`rollbank.training.config`.
- Trainer-recompute scoring: the trainer's log-probs of the sampled tokens
  (:meth:`Trainer.logprobs`, or ``StepResult.logprobs`` of a step: the weights *before* that
  step) are the current policy's ``l_pi``. :func:`recompute_scoring` turns them into the
  divergence statistics, the corrections and the staleness report of a tensor batch;
  :func:`score_batch_with_recompute` fills a :class:`~rollbank.batching.batch.Batch`'s
  staleness columns from them (:func:`rollbank.staleness.rows.score_batch`), so it can be
  written as a schema-v2 batch.

The alternative scorer is the serving engine scoring each sequence with prompt log-probs
(``scorer = "engine_prompt_logprobs"``: the engine's numerics, no trainer forward pass); it is
**not built here** (the ready-bank wiring of docs/staleness.md will call it through a
``PolicyScorer``). Trainer recompute measures staleness *plus* the engine/trainer numerics
mismatch (issue #11 item 4 separates the two); engine scoring measures staleness only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from rollbank.batching.batch import Batch
from rollbank.batching.loader import TensorBatch
from rollbank.staleness.config import CorrectionMode, StalenessConfig
from rollbank.staleness.corrections import CorrectionResult, apply_correction
from rollbank.staleness.estimators import BatchDivergence, batch_divergence, log_rho, scored_rows
from rollbank.staleness.gate import StalenessGate
from rollbank.staleness.report import staleness_report
from rollbank.staleness.rows import BatchScoring, score_batch
from rollbank.training.config import TrainerConfig

SCORER = "trainer_recompute"


def loss_inputs(
    batch: TensorBatch, config: TrainerConfig
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(mask [B, T], token_weights [B, T] or None)`` for :func:`policy_loss` (see the
    rules in :mod:`rollbank.training.config`). ``None`` weights mean 1 everywhere."""
    mask = batch.loss_mask
    weights: torch.Tensor | None = None
    correction = config.correction
    if correction.mode is not CorrectionMode.NONE and batch.is_keep is not None:
        is_w, keep = batch.is_weights, batch.is_keep
        if (batch.correction_mode not in (None, correction.mode.value)
                and batch.current_logprobs is not None and batch.measured is not None):
            is_w, keep = _recorrect(batch, config)
        mask = batch.loss_mask * keep
        if config.ratio_against == "recompute" and is_w is not None:
            weights = is_w
    if batch.gate_weight is not None:
        gate = batch.gate_weight[:, None].expand_as(mask)
        weights = gate if weights is None else weights * gate
    return mask, weights


def _recorrect(batch: TensorBatch, config: TrainerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's weights/keep recomputed with ``config.correction`` on its measured rows."""
    assert batch.current_logprobs is not None and batch.measured is not None
    assert batch.is_weights is not None and batch.is_keep is not None
    rows = batch.measured.numpy()
    lm = batch.loss_mask.numpy()[rows]
    lr = log_rho(batch.old_logprobs.numpy()[rows], batch.current_logprobs.numpy()[rows], lm)
    res = apply_correction(lr, lm, config.correction)
    w, k = batch.is_weights.clone(), batch.is_keep.clone()
    idx = torch.from_numpy(np.flatnonzero(rows))
    w[idx] = torch.from_numpy(res.weights.astype(np.float32))
    k[idx] = torch.from_numpy(res.keep.astype(np.float32))
    return w, k


@dataclass(frozen=True)
class RecomputeScoring:
    """Divergence and correction of a tensor batch against the trainer's recompute."""

    divergence: BatchDivergence
    correction: CorrectionResult  # [B, T] weights / keep of ``config.correction.mode``
    report: dict[str, Any]  # staleness.report.staleness_report(...), scorer trainer_recompute

    def with_weights(self, batch: TensorBatch) -> TensorBatch:
        """``batch`` carrying these weights, keep mask and current log-probs (gate weight 1
        where the batch has none): what :meth:`Trainer.step` then applies."""
        gate = batch.gate_weight if batch.gate_weight is not None else torch.ones(
            batch.input_ids.shape[0], dtype=torch.float32)
        mode = self.report["correction"]["mode"] if self.report.get("correction") else None
        return replace(
            batch,
            is_weights=torch.from_numpy(self.correction.weights.astype(np.float32)),
            is_keep=torch.from_numpy(self.correction.keep.astype(np.float32)),
            gate_weight=gate,
            correction_mode=mode,
        )


def recompute_scoring(
    batch: TensorBatch, recompute: torch.Tensor, *, current_version: int,
    config: StalenessConfig | None = None,
) -> RecomputeScoring:
    """Score ``batch`` with the trainer's ``recompute`` (``[B, T]``, e.g.
    ``StepResult.logprobs``, whose version is the one *before* that step)."""
    cfg = config or StalenessConfig()
    if recompute.shape != batch.old_logprobs.shape:
        raise ValueError(f"recompute {tuple(recompute.shape)} != batch {tuple(batch.old_logprobs.shape)}")
    behaviour = batch.old_logprobs.numpy()
    current = recompute.detach().to(torch.float32).numpy()
    mask = batch.loss_mask.numpy()
    rows = scored_rows(list(batch.trajectory_ids), behaviour, current, mask,
                       batch.policy_versions.numpy())
    divergence = batch_divergence(rows, current_version, cfg.estimators)
    correction = apply_correction(log_rho(behaviour, current, mask), mask, cfg.correction)
    report = staleness_report(divergence, correction=correction.stats(mask),
                              current_version=current_version, scorer=SCORER)
    return RecomputeScoring(divergence, correction, report)


def recompute_by_trajectory(batch: TensorBatch, recompute: torch.Tensor) -> dict[str, list[float]]:
    """Per trajectory id, its row of ``recompute`` trimmed to its real tokens."""
    lengths = batch.attention_mask.sum(dim=1).tolist()
    return {tid: recompute[i, : int(n)].tolist()
            for i, (tid, n) in enumerate(zip(batch.trajectory_ids, lengths, strict=True))}


def score_batch_with_recompute(
    batch: Batch, tensors: TensorBatch, recompute: torch.Tensor, *, current_version: int,
    config: StalenessConfig | None = None, gate: StalenessGate | None = None,
) -> BatchScoring:
    """Fill ``batch``'s staleness columns from the trainer's recompute over ``tensors`` (the
    same rows, e.g. :func:`rollbank.batching.loader.batch_tensors` of ``batch``)."""
    current: Mapping[str, list[float]] = recompute_by_trajectory(tensors, recompute)
    return score_batch(batch, current, current_version=current_version, config=config,
                       gate=gate, scorer=SCORER)
