"""The policy-gradient loss against hand-computed values (advantages x ratios x mask)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

import torch

from rollbank.training.loss import aggregate, k3, policy_loss

LN = math.log
# two trajectories, three positions; model tokens: row 0 at t=1,2; row 1 at t=1
MASK = [[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]
LOGP = [[0.0, LN(1.5), LN(0.5)], [0.0, LN(1.1), 0.0]]  # vs old = 0: ratios 1.5, 0.5 | 1.1
ADV = [1.0, -2.0]


def _t(x: list[list[float]] | list[float]) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def test_token_mean_clipped_surrogate_by_hand() -> None:
    # row 0, r=1.5, A=1: min(1.5, clip->1.2) = 1.2 (clipped); r=0.5, A=1: min(0.5, 0.8) = 0.5
    # row 1, r=1.1, A=-2: min(-2.2, -2.2) = -2.2 -> loss = -(1.2 + 0.5 - 2.2) / 3
    loss, st = policy_loss(_t(LOGP), torch.zeros(2, 3), _t(ADV), _t(MASK), loss_agg="token-mean")
    assert loss.item() == pytest.approx(0.5 / 3, abs=1e-6)
    assert st.pg_loss == pytest.approx(0.5 / 3, abs=1e-6)
    assert st.clip_fraction == pytest.approx(1 / 3)
    assert st.ratio_mean == pytest.approx((1.5 + 0.5 + 1.1) / 3, abs=1e-6)
    assert st.ratio_max == pytest.approx(1.5, abs=1e-6)
    expect_kl = ((0.5 - LN(1.5)) + (-0.5 - LN(0.5)) + (0.1 - LN(1.1))) / 3
    assert st.approx_kl == pytest.approx(expect_kl, abs=1e-6)
    assert (st.tokens, st.sequences, st.kl) == (3, 2, 0.0)


def test_sequence_mean_by_hand() -> None:
    # row 0 mean surrogate (1.2 + 0.5) / 2 = 0.85; row 1: -2.2 -> loss = -(0.85 - 2.2) / 2
    loss, _ = policy_loss(_t(LOGP), torch.zeros(2, 3), _t(ADV), _t(MASK), loss_agg="sequence-mean")
    assert loss.item() == pytest.approx(0.675, abs=1e-6)


def test_negative_advantage_clips_below() -> None:
    # r=0.5, A=-1: min(-0.5, clip(0.5)=0.8 -> -0.8) = -0.8 (clipped); r=1.5, A=-1: min(-1.5, -1.2)
    logp = _t([[LN(0.5), LN(1.5)]])
    loss, st = policy_loss(logp, torch.zeros(1, 2), _t([-1.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx((0.8 + 1.5) / 2, abs=1e-6)
    assert st.clip_fraction == pytest.approx(0.5)


def test_asymmetric_clip_high() -> None:
    # clip_high 0.28 (DAPO): r=1.5, A=1 -> 1.28; clip_low 0.1: r=0.5, A=-1 -> -0.9
    logp = _t([[LN(1.5), LN(0.5)]])
    loss, _ = policy_loss(logp, torch.zeros(1, 2), _t([[1.0, -1.0]]), torch.ones(1, 2),
                          clip_low=0.1, clip_high=0.28)
    assert loss.item() == pytest.approx(-(1.28 - 0.9) / 2, abs=1e-6)


def test_on_policy_gradient_is_minus_advantage_over_tokens() -> None:
    # r = 1 everywhere: d loss / d logp[b, t] = -A_b * mask[b, t] / 3 (token-mean)
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(2, 3), _t(ADV), _t(MASK))
    torch.autograd.backward(loss)
    assert logp.grad is not None
    expect = _t([[0.0, -1 / 3, -1 / 3], [0.0, 2 / 3, 0.0]])
    assert torch.allclose(logp.grad, expect, atol=1e-7)


def test_clipped_token_has_no_gradient() -> None:
    logp = torch.tensor([[LN(1.5), LN(1.1)]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 2), _t([1.0]), torch.ones(1, 2))
    torch.autograd.backward(loss)
    assert logp.grad is not None
    # token 0 is clipped (1.5 > 1.2): no gradient; token 1: -A * r / N = -1.1 / 2
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-1.1 / 2, abs=1e-6)


def test_token_weights_scale_the_surrogate() -> None:
    w = _t([[0.0, 2.0, 0.5], [0.0, 1.0, 0.0]])
    loss, _ = policy_loss(_t(LOGP), torch.zeros(2, 3), _t(ADV), _t(MASK), token_weights=w)
    assert loss.item() == pytest.approx(-(2 * 1.2 + 0.5 * 0.5 - 2.2) / 3, abs=1e-6)


def test_k3_kl_to_reference_by_hand() -> None:
    # logp = 0, ref = ln 2 on every model token: k3 = 2 - ln 2 - 1
    k = 2.0 - LN(2.0) - 1.0
    assert k3(torch.zeros(1), torch.tensor([LN(2.0)])).item() == pytest.approx(k, abs=1e-6)
    logp = torch.zeros(2, 3)
    ref = torch.full((2, 3), LN(2.0))
    loss, st = policy_loss(logp, logp, torch.zeros(2), _t(MASK), ref_logp=ref, kl_coef=0.5)
    assert st.kl == pytest.approx(k, abs=1e-6)
    assert loss.item() == pytest.approx(0.5 * k, abs=1e-6)


def test_micro_batches_with_whole_batch_denominators_sum_to_the_full_loss() -> None:
    for mode in ("token-mean", "sequence-mean"):
        full, _ = policy_loss(_t(LOGP), torch.zeros(2, 3), _t(ADV), _t(MASK), loss_agg=mode)
        parts = [
            policy_loss(_t(LOGP)[i:i + 1], torch.zeros(1, 3), _t(ADV)[i:i + 1], _t(MASK)[i:i + 1],
                        loss_agg=mode, total_tokens=3, total_sequences=2)[0]
            for i in range(2)
        ]
        assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), abs=1e-6)


def test_off_mask_positions_cannot_overflow() -> None:
    logp = torch.tensor([[500.0, 0.0]], requires_grad=True)  # padding holds garbage
    loss, st = policy_loss(logp, torch.zeros(1, 2), _t([1.0]), _t([[0.0, 1.0]]))
    torch.autograd.backward(loss)
    assert logp.grad is not None and torch.isfinite(logp.grad).all()
    assert math.isfinite(loss.item()) and st.ratio_max == 1.0


def test_empty_mask_gives_zero_loss() -> None:
    loss, st = policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), _t([1.0]), torch.zeros(1, 2))
    assert loss.item() == 0.0 and st.tokens == 0 and st.sequences == 0


def test_aggregate_rejects_unknown_mode_and_shapes() -> None:
    with pytest.raises(ValueError):
        aggregate(torch.zeros(1, 2), torch.ones(1, 2), "bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        policy_loss(torch.zeros(1, 2), torch.zeros(1, 3), _t([1.0]), torch.ones(1, 2))
