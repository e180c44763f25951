"""The loop's step corrects a stale batch against the trainer's weights, not the engines'.

In async training a batch waits up to ``loop.max_lag`` versions after the gate in collection
scored it (with the engines' weights when its group completed: rho ~ 1). With the ratio taken
against the trainer's recompute, the importance weights must be ``min(pi_theta / mu, C)`` for
the weights the step updates; `rollbank train`'s step used the batch's collection-time ones.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from rollbank.batching.loader import TensorBatch
from rollbank.staleness.config import CorrectionConfig, CorrectionMode
from rollbank.training.config import LoraSettings, TrainerConfig
from rollbank.training.loop_run import BuiltinTrainer, rescore_at_step, scores_at_step
from rollbank.training.trainer import Trainer

pytestmark = pytest.mark.integration

CAP = 2.0


def _config() -> TrainerConfig:
    return TrainerConfig.model_validate({
        "model": "tiny", "finetune": "lora", "lr": 2e-2, "micro_batch_size": 4,
        "logprob_chunk": 16, "lora": LoraSettings(rank=4, alpha=8.0),
        "ratio_against": "recompute",
        "correction": CorrectionConfig(mode=CorrectionMode.TOKEN_TIS, tis_cap=CAP),
    })


def _stale_batch(trainer: Trainer) -> TensorBatch:
    """Two groups of four scored by ``trainer``'s current weights (the behaviour policy),
    advantages +-1, carrying collection-time weights 1 (what a gate scoring at k3 ~ 0 writes)."""
    gen = torch.Generator().manual_seed(5)
    b, t, prompt = 8, 14, 5
    mask = torch.zeros(b, t)
    mask[:, prompt:] = 1.0
    versions = torch.full((b, t), -1, dtype=torch.int32)
    versions[:, prompt:] = 0
    batch = TensorBatch(
        input_ids=torch.randint(3, 2048, (b, t), generator=gen),
        attention_mask=torch.ones(b, t, dtype=torch.int64), loss_mask=mask,
        old_logprobs=torch.zeros(b, t), policy_versions=versions,
        advantages=torch.tensor([1.0, -1.0] * 4), rewards=torch.tensor([1.0, 0.0] * 4),
        prompt_lens=torch.full((b,), prompt, dtype=torch.int64),
        group_index=torch.tensor([0] * 4 + [1] * 4),
        trajectory_ids=tuple(f"g{i // 4}/s{i % 4}/r0" for i in range(b)),
        is_weights=mask.clone(), is_keep=mask.clone(), gate_weight=torch.ones(b),
        correction_mode="token_tis")
    return replace(batch, old_logprobs=trainer.logprobs(batch))


def test_the_loops_step_weights_a_stale_batch_by_the_trainers_own_ratio() -> None:
    config = _config()
    assert scores_at_step(config)
    loop = BuiltinTrainer(config)
    reference = Trainer.load(config)  # same seed: the same LoRA init
    batch = _stale_batch(loop.trainer)
    for t in (loop.trainer, reference):  # the trainer moves on while the batch waits
        for _ in range(3):
            t.step(batch)
    now = reference.logprobs(batch)
    mask = batch.loss_mask
    expected = torch.clamp(torch.exp(now - batch.old_logprobs), max=CAP) * mask
    rescored, extra = rescore_at_step(reference, batch)
    assert rescored.is_weights is not None
    assert torch.allclose(rescored.is_weights * mask, expected, atol=1e-5)
    assert not torch.allclose(expected, mask.to(expected.dtype))  # the batch's 1s are stale
    assert extra["trainer_k3_mean"] > 0 and extra["correction_frac_truncated"] > 0

    metrics = loop.train(batch)  # the loop's step: re-scored, then stepped
    reference.step(rescored)  # the same step with the trainer-time weights, explicitly
    assert metrics["trainer_k3_mean"] == pytest.approx(extra["trainer_k3_mean"])
    for (name, a), b in zip(loop.trainer.model.named_parameters(), reference.model.parameters(),
                            strict=True):
        if a.requires_grad:
            assert torch.allclose(a, b, atol=1e-6), name
