"""Real optimizer steps on the tiny model from a batch written and read back as Parquet."""

from __future__ import annotations

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
from rollbank.batching.loader import TensorBatch, read_batch_dir, table_to_tensors
from rollbank.batching.writer import write_batch
from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.training.checkpoint import LATEST_NAME, META_NAME, read_meta
from rollbank.training.config import LoraSettings, TrainerConfig
from rollbank.training.logprobs import token_logprobs
from rollbank.training.trainer import Trainer

pytestmark = pytest.mark.integration

GROUP = 4
REWARDS = (1.0, 0.0, 1.0, 0.0)


def _trajectory(gid: str, slot: int, rng: torch.Generator, model: object, version: int) -> Trajectory:
    """Prompt, a model turn, an observation, a model turn; behaviour log-probs from ``model``."""
    t = Trajectory(trajectory_id=f"{gid}/s{slot}/r0", group_id=gid, task_id=gid, attempt=slot)
    t.append_prompt(torch.randint(3, 2048, (6,), generator=rng).tolist())
    t.prompt_len = 6
    for turn in range(2):
        ids = torch.randint(3, 2048, (5 + slot + turn,), generator=rng).tolist()
        t.append_model(ids, [0.0] * len(ids), version)
        t.append_prompt(torch.randint(3, 2048, (3,), generator=rng).tolist())
    tensor = torch.tensor([t.token_ids])
    with torch.no_grad():
        lp = token_logprobs(model, tensor, torch.ones_like(tensor),
                            select=torch.tensor([t.loss_mask]))
    t.logprobs = [float(x) if m else 0.0 for x, m in zip(lp[0].tolist(), t.loss_mask, strict=True)]
    reward = REWARDS[slot]
    t.outcome = EpisodeOutcome.of(
        Reason.VERIFIED_PASS if reward else Reason.VERIFIED_FAIL, reward=reward
    )
    return t


def _batch(trainer: Trainer, root: Path) -> TensorBatch:
    rng = torch.Generator().manual_seed(11)
    groups = []
    for g in range(2):
        gid = f"g{g}"
        trajs = tuple(_trajectory(gid, s, rng, trainer.model, version=0) for s in range(GROUP))
        adv = grpo_advantages(list(REWARDS), AdvantageConfig())
        groups.append(GroupResult(gid, gid, g, trajs, adv.rewards, adv.advantages,
                                  adv.zero_variance, GROUP, 0, 0, 0.0, 1.0))
    d = DistStats(1, 1.0, 1.0, 1.0, 1.0)
    batch = Batch(0, tuple(groups), BatchAccounting(8, 8, 0, 0, 0, 0),
                  SelectionProfile(d, d, d, d, 0.5, 0.5, 0, d), 0.0, 1.0, True)
    return table_to_tensors(read_batch_dir(write_batch(root / "batches", batch)))


def _mean_logp(lp: torch.Tensor, batch: TensorBatch, positive: bool) -> float:
    sel = batch.loss_mask.bool() & ((batch.advantages > 0) == positive)[:, None]
    return float(lp[sel].mean().item())


@pytest.mark.parametrize(
    ("finetune", "lr", "agg"),
    [("lora", 2e-3, "token-mean"), ("full", 3e-4, "sequence-mean")],
)
def test_steps_raise_positive_tokens_and_save_reload_is_exact(
    tmp_path: Path, finetune: str, lr: float, agg: str
) -> None:
    config = TrainerConfig.model_validate({
        "model": "tiny", "finetune": finetune, "lr": lr, "loss_agg": agg, "micro_batch_size": 3,
        "logprob_chunk": 16, "lora": LoraSettings(rank=4, alpha=8.0), "kl_coef": 0.01,
    })
    trainer = Trainer.load(config)
    batch = _batch(trainer, tmp_path)
    assert batch.input_ids.shape[0] == 8 and torch.allclose(batch.advantages.abs(), torch.ones(8), atol=1e-5)
    before_w = [p.detach().clone() for p in trainer.params]
    before = trainer.logprobs(batch)
    # on-policy batch: the trainer's recompute equals the recorded behaviour log-probs
    assert torch.allclose(before, batch.old_logprobs, atol=1e-5)

    results = [trainer.step(batch) for _ in range(4)]
    # step 1 returns the log-probs of the weights it started from, per token
    assert torch.allclose(results[0].logprobs, before, atol=1e-5)
    assert (results[0].logprobs[batch.loss_mask == 0] == 0).all()
    for r in results:
        m = r.metrics
        assert torch.isfinite(torch.tensor([m.loss, m.grad_norm, m.approx_kl, m.kl])).all()
        assert m.tokens == int(batch.loss_mask.sum().item()) and m.micro_batches == 3
    assert results[0].metrics.clip_fraction == 0.0 and results[-1].metrics.approx_kl > 0
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before_w, trainer.params, strict=True))

    after = trainer.logprobs(batch)
    assert _mean_logp(after, batch, True) > _mean_logp(before, batch, True)
    assert _mean_logp(after, batch, False) < _mean_logp(before, batch, False)

    out = trainer.save(tmp_path / "weights", version=4)
    assert out.name == "v000004" and (tmp_path / "weights" / LATEST_NAME).read_text() == "4\n"
    assert read_meta(out)["kind"] == finetune and (out / META_NAME).is_file()
    expected = {"adapter_config.json", "adapter_model.safetensors"} if finetune == "lora" else {
        "config.json", "model.safetensors", "tokenizer.json"}
    assert expected <= {p.name for p in out.iterdir()}
    assert not [p for p in (tmp_path / "weights").iterdir() if p.name.startswith(".")]
    with pytest.raises(FileExistsError):
        trainer.save(tmp_path / "weights", version=4)

    reloaded = Trainer.load(config, weights=out)
    assert torch.equal(reloaded.logprobs(batch), after)


def test_micro_batch_size_does_not_change_the_step(tmp_path: Path) -> None:
    base = {"model": "tiny", "finetune": "full", "lr": 1e-3, "logprob_chunk": 8}
    one = Trainer.load(TrainerConfig.model_validate({**base, "micro_batch_size": 1}))
    batch = _batch(one, tmp_path)
    # behaviour log-probs off-policy by a little, so the ratio and clip are exercised
    shifted = TensorBatch(**{**batch.__dict__, "old_logprobs": batch.old_logprobs - 0.3 * batch.loss_mask})
    all_rows = Trainer.load(TrainerConfig.model_validate({**base, "micro_batch_size": 8}))
    a, b = one.step(shifted).metrics, all_rows.step(shifted).metrics
    assert a.micro_batches == 8 and b.micro_batches == 1
    assert a.loss == pytest.approx(b.loss, rel=1e-5)
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
    assert a.clip_fraction == pytest.approx(b.clip_fraction) and a.clip_fraction > 0
    # the accumulated (clipped) gradients agree; the Adam update itself amplifies float noise
    # on near-zero gradients (g / sqrt(g^2)), so the new weights are not compared
    for p, q in zip(one.params, all_rows.params, strict=True):
        assert p.grad is not None and q.grad is not None
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4)
