"""Configuration of the built-in trainer (:class:`TrainerConfig`).

Every knob of the policy-gradient step lives here; the math it selects is in
:mod:`rollbank.training.loss`, the model handling in :mod:`rollbank.training.trainer`.

Loss aggregation (``loss_agg``), for per-token surrogate terms ``l[b, t]`` on the model tokens
(``loss_mask == 1``) of the whole optimizer batch (all micro-batches together):

- ``token-mean``: ``sum_{b,t} l[b,t] / sum_{b,t} mask[b,t]``. Every model token weighs the
  same, so long trajectories carry more of the gradient (DAPO / Dr. GRPO style "token-level"
  loss). The denominator is the token count of the whole batch, not of each micro-batch, so
  the gradient does not depend on the micro-batch size.
- ``sequence-mean``: ``mean_b ( sum_t l[b,t] / sum_t mask[b,t] )`` over trajectories with at
  least one model token. Every trajectory weighs the same whatever its length (the original
  GRPO aggregation); a token of a short trajectory weighs more than one of a long one.

Ratio (``ratio_against``): the PPO ratio ``pi / pi_ref`` for each sampled token is taken
against either

- ``behaviour``: the engine's recorded log-prob (``old_logprobs`` of the batch). The clip
  then bounds the whole off-policy gap (staleness + engine/trainer numerics) in one step.
- ``recompute``: the trainer's own log-prob of the token at the start of the step (detached).
  With one optimizer step per batch the ratio is exactly 1 and the clip never triggers: the
  update is the plain GRPO policy gradient; off-policy corrections (importance weights, see
  ``token_weights`` in :func:`rollbank.training.loss.policy_loss`) must then be supplied.

Clip: ``min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)`` per token (``clip_high`` >
``clip_low`` is DAPO's "clip-higher"). KL: optional ``kl_coef * k3(pi || pi_base)`` per token
(``k3 = exp(l_base - l) - (l_base - l) - 1``, Schulman's non-negative unbiased estimator),
aggregated like the surrogate; the reference is the initial weights (the base model with the
LoRA adapter disabled, or a frozen copy for full fine-tuning).

Staleness correction (``correction``, issue #11; :mod:`rollbank.training.correction`): a
schema-v2 batch carries per-token importance weights ``is_weights``, a keep mask ``is_keep``
and a per-row gate weight ``gate_weight``. With ``correction.mode != "none"`` the loss uses
``mask = loss_mask * is_keep`` (rejected tokens leave the numerator *and* the normaliser) and
``token_weights = is_weights * gate_weight[:, None]``. The weights estimate ``pi_old / mu``
(current policy over behaviour), i.e. the decoupled objective of Yao et al. (TIS): they belong
with ``ratio_against = "recompute"``. With ``ratio_against = "behaviour"`` the PPO ratio is
already ``pi / mu``, so multiplying by ``is_weights`` would count ``rho`` twice: the step then
applies the keep mask and the gate weight only. If the batch's weights were computed with
another mode than ``correction.mode`` and its rows carry ``current_logprobs``, the step
recomputes them with ``correction``. ``mode = "none"``: ``is_weights``/``is_keep`` are
ignored; the gate weight still applies (it is the gate's decision, not a correction).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rollbank.config import Section
from rollbank.staleness.config import CorrectionConfig

LossAgg = Literal["token-mean", "sequence-mean"]
RatioAgainst = Literal["behaviour", "recompute"]
Finetune = Literal["lora", "full"]
DType = Literal["float32", "bfloat16"]


class LoraSettings(Section):
    """PEFT LoRA adapter (used when ``finetune = "lora"``)."""

    rank: int = Field(default=16, ge=1, description="LoRA rank r of every adapted matrix")
    alpha: float = Field(default=32.0, gt=0, description="LoRA alpha; the update is scaled by alpha / rank")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="dropout on the LoRA input (0: deterministic)")
    targets: tuple[str, ...] = Field(
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        min_length=1,
        description="module name suffixes that get an adapter (vLLM serves these for Llama/Gemma)",
    )


class TrainerConfig(Section):
    """The built-in GRPO/PPO-style token-level policy-gradient trainer."""

    model: str = Field(
        default="tiny",
        description="model to train: 'tiny', 'gemma-3-270m' or a local HF folder (ensure_model)",
    )
    finetune: Finetune = Field(
        default="lora", description="'lora': train a PEFT LoRA adapter; 'full': train every weight"
    )
    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA adapter settings")
    dtype: DType = Field(
        default="float32",
        description="dtype of the trained weights and the forward pass; log-softmax is always fp32",
    )
    fp32_lm_head: bool = Field(
        default=True,
        description="run the LM head in fp32 even when dtype is bfloat16 (closer to the engine's fp32 log-probs)",
    )
    loss_agg: LossAgg = Field(
        default="token-mean", description="'token-mean' or 'sequence-mean' (see the module doc)"
    )
    ratio_against: RatioAgainst = Field(
        default="behaviour",
        description="denominator of the PPO ratio: engine log-probs or the trainer's recompute",
    )
    correction: CorrectionConfig = Field(
        default_factory=CorrectionConfig,
        description="the staleness correction the loss applies (mode and caps; default: the "
        "staleness package's default, token TIS with cap 2); see the module doc",
    )
    clip_low: float = Field(default=0.2, ge=0, lt=1, description="PPO clip epsilon below 1 (ratio >= 1 - clip_low)")
    clip_high: float = Field(default=0.2, ge=0, description="PPO clip epsilon above 1 (ratio <= 1 + clip_high)")
    kl_coef: float = Field(
        default=0.0, ge=0, description="weight of the k3 KL to the initial weights (0: no reference pass)"
    )
    temperature: float = Field(
        default=1.0, gt=0, description="sampling temperature the engine used; logits are divided by it"
    )
    lr: float = Field(default=1e-5, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas")
    max_grad_norm: float = Field(
        default=1.0, ge=0, description="clip the global gradient norm to this (0: no clipping)"
    )
    micro_batch_size: int = Field(
        default=2, ge=1, description="trajectories per forward/backward; gradients accumulate"
    )
    logprob_chunk: int = Field(
        default=256, ge=1,
        description="positions per LM-head chunk: peak logits memory is chunk x vocab x 4 bytes",
    )
    gradient_checkpointing: bool = Field(
        default=False, description="recompute decoder activations in backward (less memory, slower)"
    )
    seed: int = Field(default=0, description="torch seed (LoRA init, dropout)")
    threads: int | None = Field(
        default=None, ge=1, description="torch intra-op threads (None: torch's default)"
    )

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.betas[0] < 0 or self.betas[0] >= 1 or self.betas[1] < 0 or self.betas[1] >= 1:
            raise ValueError("betas must be in [0, 1)")
        return self
