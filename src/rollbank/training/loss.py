"""The policy-gradient loss as pure functions on tensors (no model, no I/O).

Shapes: ``[B, T]`` per-token tensors aligned with the loader (``mask`` = loss mask, 1 on
model-sampled tokens); ``advantages`` is ``[B]`` (one per trajectory, broadcast over its
tokens) or ``[B, T]``.

Per token, with ``log_ratio = logp - old_logp`` and ``r = exp(log_ratio)``::

    surrogate = min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)
    l         = -w * surrogate  +  kl_coef * k3(logp, ref_logp)

``w`` are optional, detached per-token weights (importance-sampling corrections such as TIS;
1 when absent). The loss is ``aggregate(l)`` (token-mean or sequence-mean, see
:mod:`rollbank.training.config`). ``total_tokens`` / ``total_sequences`` let a micro-batch
use the whole optimizer batch's denominators, so summing the micro-batch losses gives the
full-batch loss exactly (gradient accumulation that does not depend on the micro-batch size).

Statistics (over this call's model tokens, detached): clip fraction (tokens whose clipped term
is the active one), mean/max ratio, approx KL ``k3(old || new)`` = mean of
``r - 1 - log r`` (Schulman's non-negative estimator of KL(old || new) from old's samples).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rollbank.training.config import LossAgg


@dataclass(frozen=True)
class LossStats:
    """Detached statistics of one loss call (means over its ``tokens`` model tokens)."""

    loss: float
    pg_loss: float  # the surrogate part of ``loss`` (same aggregation)
    kl: float  # the k3-to-reference part before ``kl_coef`` (same aggregation; 0 without ref)
    clip_fraction: float
    ratio_mean: float
    ratio_max: float
    approx_kl: float
    tokens: int
    sequences: int


def k3(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Per-token ``k3 = q/p - 1 - log(q/p)`` from samples of p: estimates KL(p || q), >= 0."""
    d = logq - logp
    return torch.exp(d) - d - 1.0


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAgg,
    *,
    total_tokens: float | None = None,
    total_sequences: float | None = None,
) -> torch.Tensor:
    """Aggregate per-token ``values`` over ``mask`` (token-mean or sequence-mean)."""
    m = mask.to(values.dtype)
    if mode == "token-mean":
        denom = float(m.sum().item()) if total_tokens is None else float(total_tokens)
        return (values * m).sum() / max(denom, 1.0)
    if mode == "sequence-mean":
        per_seq_tokens = m.sum(dim=-1)
        has = per_seq_tokens > 0
        per_seq = (values * m).sum(dim=-1) / per_seq_tokens.clamp(min=1.0)
        denom = float(has.sum().item()) if total_sequences is None else float(total_sequences)
        return per_seq[has].sum() / max(denom, 1.0)
    raise ValueError(f"unknown loss aggregation {mode!r}")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    loss_agg: LossAgg = "token-mean",
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    token_weights: torch.Tensor | None = None,
    total_tokens: float | None = None,
    total_sequences: float | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """Clipped-surrogate policy loss (to minimise) and its statistics."""
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"shape mismatch: logp {tuple(logp.shape)}, old {tuple(old_logp.shape)}, mask {tuple(mask.shape)}")
    adv = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
    if adv.shape != logp.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} do not match {tuple(logp.shape)}")
    m = mask.to(torch.float32)
    on = m > 0
    # Off-mask positions may hold anything (padding, prompt): zero their log-ratio so exp()
    # cannot overflow into NaN gradients.
    log_ratio = torch.where(on, logp - old_logp.detach(), torch.zeros_like(logp))
    ratio = torch.exp(log_ratio)
    adv = adv.detach().to(ratio.dtype)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    if token_weights is not None:
        surrogate = surrogate * token_weights.detach().to(surrogate.dtype)
    totals = {"total_tokens": total_tokens, "total_sequences": total_sequences}
    pg = aggregate(-surrogate, m, loss_agg, **totals)
    kl = torch.zeros((), dtype=pg.dtype, device=pg.device)
    if ref_logp is not None:
        kl_tok = torch.where(on, k3(logp, ref_logp.detach()), torch.zeros_like(logp))
        kl = aggregate(kl_tok, m, loss_agg, **totals)
    loss = pg + kl_coef * kl if ref_logp is not None else pg
    with torch.no_grad():
        n = int(on.sum().item())
        r_on = ratio[on]
        lr_on = log_ratio[on]
        stats = LossStats(
            loss=float(loss.item()),
            pg_loss=float(pg.item()),
            kl=float(kl.item()),
            clip_fraction=float((unclipped[on] > clipped[on]).float().mean().item()) if n else 0.0,
            ratio_mean=float(r_on.mean().item()) if n else 1.0,
            ratio_max=float(r_on.max().item()) if n else 1.0,
            approx_kl=float((r_on - 1.0 - lr_on).mean().item()) if n else 0.0,
            tokens=n,
            sequences=int((m.sum(dim=-1) > 0).sum().item()),
        )
    return loss, stats
