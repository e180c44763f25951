"""Trainer-recompute staleness on the tiny model: a batch sampled by weights v0 diverges from
the trainer after one step (v1); the same tokens re-scored by v1 do not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from rollbank.batching.advantages import grpo_advantages
from rollbank.batching.batch import (
    Batch,
    BatchAccounting,
    DistStats,
    GroupResult,
    SelectionProfile,
)
from rollbank.batching.config import AdvantageConfig
from rollbank.batching.loader import batch_tensors, read_batch_dir, table_to_tensors
from rollbank.batching.writer import MANIFEST_NAME, write_batch
from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.staleness.config import CorrectionConfig, CorrectionMode, StalenessConfig
from rollbank.training.config import LoraSettings, TrainerConfig
from rollbank.training.correction import recompute_scoring, score_batch_with_recompute
from rollbank.training.logprobs import token_logprobs
from rollbank.training.loss import policy_loss
from rollbank.training.trainer import Trainer

pytestmark = pytest.mark.integration

GROUP = 4
REWARDS = (1.0, 0.0, 1.0, 0.0)
OUT = Path("/tmp/rollbank-staleness-tiny.json")


def _trajectory(gid: str, slot: int, rng: torch.Generator, model: object, version: int) -> Trajectory:
    t = Trajectory(trajectory_id=f"{gid}/s{slot}/r0", group_id=gid, task_id=gid, attempt=slot)
    t.append_prompt(torch.randint(3, 2048, (6,), generator=rng).tolist())
    t.prompt_len = 6
    for turn in range(2):
        ids = torch.randint(3, 2048, (5 + slot + turn,), generator=rng).tolist()
        t.append_model(ids, [0.0] * len(ids), version)
        t.append_prompt(torch.randint(3, 2048, (3,), generator=rng).tolist())
    t.logprobs = _score(model, t)
    reward = REWARDS[slot]
    t.outcome = EpisodeOutcome.of(Reason.VERIFIED_PASS if reward else Reason.VERIFIED_FAIL,
                                  reward=reward)
    return t


def _score(model: object, t: Trajectory) -> list[float]:
    tensor = torch.tensor([t.token_ids])
    with torch.no_grad():
        lp = token_logprobs(model, tensor, torch.ones_like(tensor), select=torch.tensor([t.loss_mask]))
    return [float(x) if m else 0.0 for x, m in zip(lp[0].tolist(), t.loss_mask, strict=True)]


def _batch(model: object, version: int, seed: int) -> Batch:
    rng = torch.Generator().manual_seed(seed)
    groups = []
    for g in range(2):
        gid = f"g{g}"
        trajs = tuple(_trajectory(gid, s, rng, model, version) for s in range(GROUP))
        adv = grpo_advantages(list(REWARDS), AdvantageConfig())
        groups.append(GroupResult(gid, gid, g, trajs, adv.rewards, adv.advantages,
                                  adv.zero_variance, GROUP, 0, 0, 0.0, 1.0))
    d = DistStats(1, 1.0, 1.0, 1.0, 1.0)
    return Batch(0, tuple(groups), BatchAccounting(8, 8, 0, 0, 0, 0),
                 SelectionProfile(d, d, d, d, 0.5, 0.5, 0, d), 0.0, 1.0, True)


def test_stale_batch_diverges_fresh_rescore_does_not_and_the_loss_uses_the_weights(
    tmp_path: Path,
) -> None:
    config = TrainerConfig.model_validate({
        "model": "tiny", "finetune": "lora", "lr": 5e-3, "micro_batch_size": 4,
        "logprob_chunk": 16, "lora": LoraSettings(rank=4, alpha=8.0),
        "ratio_against": "recompute",
    })
    trainer = Trainer.load(config)
    trainer.model.eval()
    stale = _batch(trainer.model, version=0, seed=11)  # behaviour = weights v0
    tensors = batch_tensors(stale)
    first = trainer.step(tensors)  # v0 -> v1; its logprobs are v0's recompute
    recompute = trainer.logprobs(tensors)  # current policy (v1) on the stale tokens
    stale_scoring = recompute_scoring(tensors, recompute, current_version=1)
    fresh_v0 = recompute_scoring(tensors, first.logprobs, current_version=0)
    d_stale, d_v0 = stale_scoring.divergence.tokens, fresh_v0.divergence.tokens
    # IcePop with the band between the measured quartiles of rho: it must mask some tokens
    low, high = (float(torch.tensor(d_stale.percentiles[k]).exp()) for k in ("p25", "p75"))
    cfg = StalenessConfig(correction=CorrectionConfig(
        mode=CorrectionMode.ICEPOP, icepop_low=low, icepop_high=high))
    assert d_stale.n_tokens == int(tensors.loss_mask.sum().item()) > 0
    assert d_stale.k3 > 1e-4 and d_stale.max_abs_log_rho > 1e-2 and d_stale.ess < 1.0
    assert d_v0.k3 < 1e-9 and d_v0.max_abs_log_rho < 1e-4  # v0 re-scores v0: numerics only
    assert stale_scoring.divergence.version_lag_histogram == {1: d_stale.n_tokens}

    # a fresh batch sampled by the current weights, re-scored by the same weights: zero
    trainer.model.eval()
    fresh = _batch(trainer.model, version=1, seed=12)
    fresh_tensors = batch_tensors(fresh)
    fresh_scoring = score_batch_with_recompute(
        fresh, fresh_tensors, trainer.logprobs(fresh_tensors), current_version=1, config=cfg)
    d_fresh = fresh_scoring.divergence
    assert d_fresh is not None and d_fresh.tokens.k3 < 1e-9
    assert d_fresh.tokens.max_abs_log_rho < 1e-4 and d_fresh.version_lag_histogram == {
        0: d_fresh.tokens.n_tokens}

    # the stale batch, scored and written as schema v2, then read back for the trainer
    scored = score_batch_with_recompute(stale, tensors, recompute, current_version=1, config=cfg)
    path = write_batch(tmp_path / "batches", scored.batch)
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    assert manifest["staleness_report"]["divergence"]["tokens"]["k3"] == pytest.approx(d_stale.k3)
    loaded = table_to_tensors(read_batch_dir(path))
    assert loaded.is_keep is not None and loaded.is_weights is not None
    assert loaded.gate_weight is not None
    masked = int((loaded.loss_mask - loaded.is_keep).sum().item())
    assert 0 < masked < int(loaded.loss_mask.sum().item())  # IcePop band rejected some tokens

    # Trainer.step's loss = hand-computed loss with weights is_weights * gate_weight and mask
    # loss_mask * is_keep (ratio against the recompute: r = 1 at the start of the step)
    trainer.config = trainer.config.model_copy(update={"correction": cfg.correction})
    before = trainer.logprobs(loaded)
    result = trainer.step(loaded)
    assert torch.allclose(result.logprobs, before, atol=1e-5)
    mask = loaded.loss_mask * loaded.is_keep
    weights = loaded.is_weights * loaded.gate_weight[:, None]
    adv = loaded.advantages[:, None].expand_as(mask)
    expected = -(weights * adv * mask).sum() / mask.sum()
    assert result.metrics.pg_loss == pytest.approx(float(expected), abs=1e-5)
    assert result.metrics.tokens == int(mask.sum().item())
    hand, _ = policy_loss(before, before, loaded.advantages, mask, token_weights=weights)
    assert result.metrics.pg_loss == pytest.approx(float(hand), abs=1e-5)
    unweighted = -(adv * loaded.loss_mask).sum() / loaded.loss_mask.sum()
    assert abs(float(expected) - float(unweighted)) > 1e-4  # the weights did change the loss

    OUT.write_text(json.dumps({
        "stale_v0_scored_by_v1_trainer_recompute": d_stale.to_dict(),
        "v0_rescored_by_v0": d_v0.to_dict(),
        "fresh_v1_rescored_by_v1": d_fresh.tokens.to_dict(),
        "icepop_masked_tokens": masked, "model_tokens": int(loaded.loss_mask.sum().item()),
        "pg_loss": result.metrics.pg_loss, "pg_loss_unweighted_hand": float(unweighted),
    }, indent=2))
