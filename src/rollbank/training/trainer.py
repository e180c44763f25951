"""The built-in trainer: one GRPO/PPO-style optimizer step per batch of rollbank tensors.

Owns :class:`Trainer`: it loads a policy (full fine-tuning, or a PEFT LoRA adapter on a frozen
base), splits a :class:`~rollbank.batching.loader.TensorBatch` into micro-batches (each
trimmed to its own longest row), recomputes the sampled tokens' log-probs with the chunked LM
head (:mod:`rollbank.training.logprobs`), accumulates the clipped-surrogate loss
(:mod:`rollbank.training.loss`) with whole-batch denominators, clips the gradient norm, steps
AdamW, and saves versioned weight directories (:mod:`rollbank.training.checkpoint`).

Invariants
- :meth:`Trainer.step` returns, per token, the trainer's log-prob of the sampled token under
  the weights *before* the step (``StepResult.logprobs``, 0 off the loss mask): the current
  policy's recompute that staleness measurement compares with the behaviour log-probs.
- The loss of a batch does not depend on ``micro_batch_size`` (up to float reordering).
- Nothing here contacts a model hub (models come from :func:`ensure_model`).
"""

from __future__ import annotations

import copy
import importlib
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from rollbank.batching.loader import TensorBatch
from rollbank.inference.models import OFFLINE_ENV, ensure_model
from rollbank.training.checkpoint import copy_tokenizer, read_meta, write_version
from rollbank.training.config import TrainerConfig
from rollbank.training.correction import loss_inputs
from rollbank.training.logprobs import causal_lm, token_logprobs
from rollbank.training.loss import LossStats, policy_loss

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class StepMetrics:
    """What one optimizer step did (means are over the batch's model tokens)."""

    step: int
    loss: float
    pg_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    ratio_max: float
    approx_kl: float
    grad_norm: float
    lr: float
    tokens: int
    sequences: int
    micro_batches: int
    seconds: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True)
class StepResult:
    metrics: StepMetrics
    logprobs: torch.Tensor  # [B, T] trainer log-probs before the step (0 off the loss mask)


@dataclass(frozen=True)
class MicroBatch:
    """Rows ``start:stop`` of a batch, trimmed to their longest row."""

    start: int
    stop: int
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor


def micro_batches(batch: TensorBatch, size: int) -> list[MicroBatch]:
    """Split ``batch`` into micro-batches of ``size`` rows (right padding trimmed per slice)."""
    if size < 1:
        raise ValueError("micro-batch size must be >= 1")
    out = []
    rows = batch.input_ids.shape[0]
    for start in range(0, rows, size):
        stop = min(start + size, rows)
        attn = batch.attention_mask[start:stop]
        width = max(int(attn.sum(dim=1).max().item()), 1) if stop > start else 1
        out.append(MicroBatch(
            start, stop, batch.input_ids[start:stop, :width], attn[:, :width],
            batch.loss_mask[start:stop, :width], batch.old_logprobs[start:stop, :width],
            batch.advantages[start:stop],
        ))
    return out


def _peft() -> Any:
    """The ``peft`` module (imported lazily: full fine-tuning does not need it)."""
    return importlib.import_module("peft")


def load_policy(config: TrainerConfig, weights: Path | None = None) -> Any:
    """The trainable policy: ``config.model`` (or a full ``weights`` dir), LoRA-wrapped if asked."""
    os.environ.update(OFFLINE_ENV)
    from transformers import AutoModelForCausalLM

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    meta = read_meta(weights) if weights is not None else None
    if meta is not None and meta.get("kind") != config.finetune:
        raise ValueError(f"{weights} holds {meta.get('kind')} weights, the config trains {config.finetune}")
    base = weights if weights is not None and config.finetune == "full" else ensure_model(config.model)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=DTYPES[config.dtype])
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.finetune == "lora":
        peft = _peft()
        if weights is not None:
            model = peft.PeftModel.from_pretrained(model, str(weights), is_trainable=True)
        else:
            lora = peft.LoraConfig(
                r=config.lora.rank, lora_alpha=config.lora.alpha, lora_dropout=config.lora.dropout,
                target_modules=list(config.lora.targets), bias="none", task_type="CAUSAL_LM",
            )
            model = peft.get_peft_model(model, lora)
    return model


class Trainer:
    """Token-level policy-gradient trainer on rollbank batches (see the module doc)."""

    def __init__(self, config: TrainerConfig, model: Any, *, base_model: Path) -> None:
        self.config = config
        self.model = model
        self.base_model = base_model
        self.steps = 0
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        self._reference: Any = None
        if config.kl_coef > 0 and config.finetune == "full":
            self._reference = copy.deepcopy(model).eval().requires_grad_(False)

    @classmethod
    def load(cls, config: TrainerConfig, *, weights: Path | None = None) -> Trainer:
        """Load ``config.model`` (and a saved version directory ``weights``, if given)."""
        if weights is not None and config.finetune == "lora":
            base = Path(read_meta(weights)["base_model"])
        elif weights is not None:
            base = Path(read_meta(weights).get("base_model", weights))
        else:
            base = ensure_model(config.model)
        return cls(config, load_policy(config, weights), base_model=base)

    @property
    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.params)

    def _logprobs(self, mb: MicroBatch, model: Any | None = None) -> torch.Tensor:
        return token_logprobs(
            self.model if model is None else model, mb.input_ids, mb.attention_mask,
            select=mb.loss_mask, chunk=self.config.logprob_chunk,
            temperature=self.config.temperature, fp32_head=self.config.fp32_lm_head,
        )

    @torch.no_grad()
    def _reference_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        if self._reference is not None:
            return self._logprobs(mb, self._reference)
        with self.model.disable_adapter():  # LoRA: the frozen base is the reference
            return self._logprobs(mb)

    @torch.no_grad()
    def logprobs(self, batch: TensorBatch) -> torch.Tensor:
        """``[B, T]`` current-policy log-probs of the batch's model tokens (0 elsewhere)."""
        self.model.eval()
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        for mb in micro_batches(batch, self.config.micro_batch_size):
            out[mb.start:mb.stop, : mb.input_ids.shape[1]] = self._logprobs(mb)
        return out

    def step(self, batch: TensorBatch, *, token_weights: torch.Tensor | None = None) -> StepResult:
        """One optimizer step on ``batch``.

        The loss uses the batch's staleness columns (``is_keep`` in the mask and normaliser,
        ``is_weights * gate_weight`` as token weights; rules in
        :mod:`rollbank.training.config`, ``correction``). An explicit ``token_weights``
        ([B, T], detached) replaces the batch-derived weights (the keep mask still applies).
        """
        t0 = time.perf_counter()
        cfg = self.config
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        mask, batch_weights = loss_inputs(batch, cfg)
        if token_weights is None:
            token_weights = batch_weights
        totals = {
            "total_tokens": float(mask.sum().item()),
            "total_sequences": float((mask.sum(dim=1) > 0).sum().item()),
        }
        recompute = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        stats: list[LossStats] = []
        mbs = micro_batches(batch, cfg.micro_batch_size)
        for mb in mbs:
            logp = self._logprobs(mb)
            old = logp.detach() if cfg.ratio_against == "recompute" else mb.old_logprobs
            ref = self._reference_logprobs(mb) if cfg.kl_coef > 0 else None
            width = mb.input_ids.shape[1]
            weights = None
            if token_weights is not None:
                weights = token_weights[mb.start:mb.stop, :width]
            loss, st = policy_loss(
                logp, old, mb.advantages, mask[mb.start:mb.stop, :width], clip_low=cfg.clip_low,
                clip_high=cfg.clip_high, loss_agg=cfg.loss_agg, ref_logp=ref,
                kl_coef=cfg.kl_coef, token_weights=weights, **totals,
            )
            torch.autograd.backward(loss)
            recompute[mb.start:mb.stop, : mb.input_ids.shape[1]] = logp.detach()
            stats.append(st)
        limit = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, limit).item())
        self.optimizer.step()
        self.steps += 1
        return StepResult(_combine(stats, self.steps, grad_norm, cfg.lr, time.perf_counter() - t0),
                          recompute)

    def save(self, root: Path, version: int) -> Path:
        """Write the current weights as ``root/vNNNNNN`` (atomic); return that directory.

        Full fine-tuning: an HF folder (config.json, model.safetensors, tokenizer) that vLLM
        loads as a model. LoRA: a PEFT adapter directory (adapter_config.json,
        adapter_model.safetensors) for the base model named in ``rollbank_weights.json``.
        """
        def write(tmp: Path) -> None:
            if self.config.finetune == "lora":
                self.model.save_pretrained(str(tmp))
            else:
                causal_lm(self.model).save_pretrained(str(tmp))
                copy_tokenizer(self.base_model, tmp)

        meta = {"kind": self.config.finetune, "base_model": str(self.base_model),
                "step": self.steps, "dtype": self.config.dtype}
        return write_version(root, version, write, meta)


def _combine(stats: list[LossStats], step: int, grad_norm: float, lr: float, seconds: float) -> StepMetrics:
    tokens = sum(s.tokens for s in stats)

    def mean(field: str) -> float:
        return sum(getattr(s, field) * s.tokens for s in stats) / tokens if tokens else 0.0

    return StepMetrics(
        step=step,
        loss=sum(s.loss for s in stats),  # micro-batch losses use whole-batch denominators
        pg_loss=sum(s.pg_loss for s in stats),
        kl=sum(s.kl for s in stats),
        clip_fraction=mean("clip_fraction"),
        ratio_mean=mean("ratio_mean"),
        ratio_max=max((s.ratio_max for s in stats), default=1.0),
        approx_kl=mean("approx_kl"),
        grad_norm=grad_norm,
        lr=lr,
        tokens=tokens,
        sequences=sum(s.sequences for s in stats),
        micro_batches=len(stats),
        seconds=seconds,
    )
