"""Chunked sampled-token log-probs equal the naive full-logits computation (tiny model)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from rollbank.inference.models import OFFLINE_ENV, ensure_model
from rollbank.training.logprobs import naive_token_logprobs, token_logprobs


@pytest.fixture(scope="module")
def tiny() -> Any:
    import os

    os.environ.update(OFFLINE_ENV)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model: Any = AutoModelForCausalLM.from_pretrained(str(ensure_model("tiny")), dtype=torch.float32)
    model.eval()
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 2048, (3, 21), generator=g)
    lengths = torch.tensor([21, 14, 9])
    attn = (torch.arange(21)[None, :] < lengths[:, None]).long()
    ids = ids * attn  # right padding with pad id 0
    select = torch.zeros(3, 21, dtype=torch.float32)
    select[:, 5:] = 1.0
    return ids, attn, select * attn


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_chunked_equals_naive_on_every_real_token(tiny: Any, chunk: int) -> None:
    ids, attn, _ = _batch()
    with torch.no_grad():
        naive = naive_token_logprobs(tiny, ids, attn)
        chunked = token_logprobs(tiny, ids, attn, chunk=chunk)
    assert chunked.shape == ids.shape
    assert torch.allclose(chunked, naive, atol=1e-5, rtol=0)
    assert (chunked[:, 0] == 0).all() and (chunked[attn == 0] == 0).all()
    assert (chunked[:, 1:][attn[:, 1:] == 1] < 0).all()  # real values, not placeholders


def test_selected_positions_only_and_temperature(tiny: Any) -> None:
    ids, attn, select = _batch()
    with torch.no_grad():
        naive = naive_token_logprobs(tiny, ids, attn, temperature=0.7)
        chunked = token_logprobs(tiny, ids, attn, select=select, chunk=5, temperature=0.7)
    on = select.bool()
    assert torch.allclose(chunked[on], naive[on], atol=1e-5, rtol=0)
    assert (chunked[~on] == 0).all()


def test_gradients_equal_naive(tiny: Any) -> None:
    ids, attn, select = _batch()
    weights = torch.linspace(-1.0, 1.0, ids.numel()).reshape(ids.shape) * select

    def grads(fn: Any) -> list[torch.Tensor]:
        tiny.zero_grad(set_to_none=True)
        torch.autograd.backward((fn() * weights).sum())
        return [p.grad.clone() for p in tiny.parameters() if p.grad is not None]

    naive = grads(lambda: naive_token_logprobs(tiny, ids, attn))
    chunked = grads(lambda: token_logprobs(tiny, ids, attn, select=select, chunk=4))
    assert len(naive) == len(chunked) > 0
    for a, b in zip(naive, chunked, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    tiny.zero_grad(set_to_none=True)


def test_bad_chunk_is_an_error(tiny: Any) -> None:
    ids, attn, _ = _batch()
    with pytest.raises(ValueError):
        token_logprobs(tiny, ids, attn, chunk=0)


def test_gemma3_tied_head_and_final_softcap_match_naive() -> None:
    """The Gemma 3 path: tied embeddings as LM head, final-logit softcapping, sliding window."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=4,
        final_logit_softcapping=5.0, tie_word_embeddings=True, pad_token_id=0,
    )
    torch.manual_seed(0)
    model: Any = Gemma3ForCausalLM(cfg)
    model.eval()
    ids, attn, select = _batch()
    ids = ids % 512
    with torch.no_grad():
        naive = naive_token_logprobs(model, ids, attn, temperature=0.9)
        chunked = token_logprobs(model, ids, attn, select=select, chunk=6, temperature=0.9)
        model.config.final_logit_softcapping = None
        uncapped = naive_token_logprobs(model, ids, attn, temperature=0.9)
    on = select.bool()
    assert torch.allclose(chunked[on], naive[on], atol=1e-5, rtol=0)
    assert not torch.allclose(chunked[on], uncapped[on], atol=1e-3)  # the cap matters here


def test_fp32_head_on_a_bf16_model_is_closer_to_fp32() -> None:
    import os

    os.environ.update(OFFLINE_ENV)
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(ensure_model("tiny")), dtype=torch.bfloat16)
    model.eval()
    ref: Any = AutoModelForCausalLM.from_pretrained(str(ensure_model("tiny")), dtype=torch.float32)
    ref.eval()
    ids, attn, select = _batch()
    on = select.bool()
    with torch.no_grad():
        exact = naive_token_logprobs(ref, ids, attn)[on]
        fp32 = token_logprobs(model, ids, attn, select=select, fp32_head=True)[on]
        bf16 = token_logprobs(model, ids, attn, select=select, fp32_head=False)[on]
    assert not torch.equal(fp32, bf16)
    assert (fp32 - exact).abs().mean() < (bf16 - exact).abs().mean()
