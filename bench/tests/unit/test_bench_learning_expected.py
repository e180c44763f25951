"""The learning bench's noise-free eval: the probability of the canonical correct completion."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rollbank.inference.models import ensure_model
from rollbank_bench.learning.policy import (
    EOS,
    TextCodec,
    canonical_completion,
    expected_solve_rates,
)
from rollbank_bench.learning.tasks import AdditionTask, verify

TASKS = [AdditionTask(3, 4, 1), AdditionTask(13, 7, 2), AdditionTask(0, 0, 1)]


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec(ensure_model("tiny"))


@pytest.mark.parametrize("budget", [12, 16])
def test_the_canonical_completion_is_a_correct_answer_within_the_token_budget(
        codec: TextCodec, budget: int) -> None:
    for task in TASKS:
        ids = canonical_completion(codec, task, budget)
        assert len(ids) <= budget
        assert verify(task, codec.completion_text(ids)) == 1.0
    full = canonical_completion(codec, TASKS[0], 64)
    assert full[-1] == EOS and full[:-1] == codec.ids(TASKS[0].action)


def test_expected_solve_rate_is_the_product_of_next_token_probabilities(codec: TextCodec) -> None:
    """Against a step-by-step softmax over the plain forward pass (no padding, one task at a
    time), so a shifted position or a padding slip in the batched path shows up."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model: Any = AutoModelForCausalLM.from_pretrained(str(ensure_model("tiny")), dtype=torch.float32)
    model.eval()
    got = expected_solve_rates(model, codec, TASKS, max_new_tokens=12)
    for task, p in zip(TASKS, got, strict=True):
        prompt = codec.prompt_ids(task.prompt)
        completion = canonical_completion(codec, task, 12)
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            probs = torch.softmax(model(input_ids=ids).logits[0].double(), dim=-1)
        want = 1.0
        for k, tok in enumerate(completion):
            want *= float(probs[len(prompt) + k - 1, tok])
        assert 0.0 < p <= 1.0
        assert p == pytest.approx(want, rel=1e-3)
