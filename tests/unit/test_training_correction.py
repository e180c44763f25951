"""Which mask and weights the trainer's loss uses from a schema-v2 batch (hand-computed)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from rollbank.batching.loader import TensorBatch  # noqa: E402
from rollbank.staleness.config import CorrectionConfig, CorrectionMode  # noqa: E402
from rollbank.training.config import TrainerConfig  # noqa: E402
from rollbank.training.correction import (  # noqa: E402
    loss_inputs,
    recompute_by_trajectory,
    recompute_scoring,
)
from rollbank.training.loss import policy_loss  # noqa: E402

LM = [[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]]
OLD = [[0.0, -1.0, -2.0, -0.5], [0.0, -0.3, -0.7, 0.0]]


def tensor_batch(**staleness: object) -> TensorBatch:
    lm = torch.tensor(LM)
    return TensorBatch(
        input_ids=torch.tensor([[1, 2, 3, 4], [1, 5, 6, 0]]),
        attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
        loss_mask=lm, old_logprobs=torch.tensor(OLD),
        policy_versions=torch.tensor([[-1, 2, 2, 3], [-1, 3, 3, -1]], dtype=torch.int32),
        advantages=torch.tensor([1.0, -1.0]), rewards=torch.tensor([1.0, 0.0]),
        prompt_lens=torch.tensor([1, 1]), group_index=torch.tensor([0, 0]),
        trajectory_ids=("g/s0/r0", "g/s1/r0"), **staleness,  # type: ignore[arg-type]
    )


V2 = {
    "is_weights": torch.tensor([[0.0, 2.0, 0.5, 0.0], [0.0, 1.0, 1.5, 0.0]]),
    "is_keep": torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0]]),
    "gate_weight": torch.tensor([1.0, 0.25]),
    "correction_mode": "token_tis",
}


def test_recompute_ratio_uses_is_weights_times_gate_and_keep_mask() -> None:
    cfg = TrainerConfig(ratio_against="recompute")
    mask, w = loss_inputs(tensor_batch(**V2), cfg)
    assert mask.tolist() == [[0, 1, 1, 0], [0, 1, 1, 0]]
    assert w is not None and w.tolist() == [[0, 2, 0.5, 0], [0, 0.25, 0.375, 0]]
    # the loss at the start of a step (logp == recompute, r = 1): -sum(w * A) / kept tokens
    logp = torch.tensor(OLD)
    loss, st = policy_loss(logp, logp, torch.tensor([1.0, -1.0]), mask, token_weights=w)
    assert float(loss) == pytest.approx(-((2 + 0.5) - (0.25 + 0.375)) / 4)
    assert st.tokens == 4  # the rejected token left the normaliser


def test_behaviour_ratio_keeps_the_mask_and_gate_but_not_is_weights() -> None:
    mask, w = loss_inputs(tensor_batch(**V2), TrainerConfig(ratio_against="behaviour"))
    assert mask.tolist() == [[0, 1, 1, 0], [0, 1, 1, 0]]
    assert w is not None and w.tolist() == [[1, 1, 1, 1], [0.25] * 4]


def test_mode_none_ignores_the_correction_columns() -> None:
    cfg = TrainerConfig(ratio_against="recompute",
                        correction=CorrectionConfig(mode=CorrectionMode.NONE))
    mask, w = loss_inputs(tensor_batch(**V2), cfg)
    assert mask.tolist() == LM
    assert w is not None and w.tolist() == [[1, 1, 1, 1], [0.25] * 4]


def test_hand_built_batch_without_staleness_is_unchanged() -> None:
    mask, w = loss_inputs(tensor_batch(), TrainerConfig())
    assert mask is not None and mask.tolist() == LM and w is None


def test_a_batch_corrected_with_another_mode_is_recorrected_from_current_logprobs() -> None:
    current = torch.tensor(OLD) + torch.tensor([[0, math.log(4.0), 0.0, 0.0], [0, 0, 0, 0]])
    batch = tensor_batch(**V2, current_logprobs=current * torch.tensor(LM),
                         measured=torch.tensor([True, False]))
    cfg = TrainerConfig(ratio_against="recompute",
                        correction=CorrectionConfig(mode=CorrectionMode.ICEPOP,
                                                    icepop_low=0.5, icepop_high=2.0))
    mask, w = loss_inputs(batch, cfg)
    # row 0 re-corrected with IcePop (rho 4 is masked; rho 1 kept); row 1 unmeasured: stored
    assert mask.tolist() == [[0, 0, 1, 1], [0, 1, 1, 0]]
    assert w is not None and w.tolist() == [[0, 0, 1, 1], [0, 0.25, 0.375, 0]]
    same = replace(batch, correction_mode="icepop")  # stored mode matches: used as stored
    assert loss_inputs(same, cfg)[0].tolist() == [[0, 1, 1, 0], [0, 1, 1, 0]]


def test_recompute_scoring_hand_values() -> None:
    batch = tensor_batch()
    current = torch.tensor(OLD) + torch.tensor([[0, math.log(3.0), 0.0, 0.0], [0, 0, 0, 0]])
    s = recompute_scoring(batch, current * torch.tensor(LM), current_version=3)
    tok = s.divergence.tokens
    assert tok.n_tokens == 5 and tok.k1 == pytest.approx(-math.log(3.0) / 5)
    assert tok.k3 == pytest.approx((2.0 - math.log(3.0)) / 5)
    assert s.divergence.version_lag_histogram == {0: 3, 1: 2}
    assert s.correction.weights[0].tolist() == [0, 2.0, 1.0, 1.0]  # token TIS cap 2
    assert s.report["scorer"] == "trainer_recompute" and s.report["correction"]["mode"] == "token_tis"
    weighted = s.with_weights(batch)
    assert weighted.gate_weight is not None and weighted.gate_weight.tolist() == [1.0, 1.0]
    assert weighted.is_weights is not None and weighted.is_weights[0, 1].item() == 2.0
    by_id = recompute_by_trajectory(batch, current)
    assert len(by_id["g/s0/r0"]) == 4 and len(by_id["g/s1/r0"]) == 3
    with pytest.raises(ValueError, match="recompute"):
        recompute_scoring(batch, current[:, :2], current_version=3)
