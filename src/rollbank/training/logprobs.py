"""Log-probs of the sampled tokens without full-vocabulary logits for the whole batch.

Owns :func:`token_logprobs` (what the trainer uses) and :func:`naive_token_logprobs` (the
plain ``model(...).logits.log_softmax`` reference it is tested against).

Why: Gemma 3's LM head has 262,144 outputs; fp32 logits of 16 x 256 positions are ~4 GiB,
and the autograd graph of a plain ``log_softmax`` keeps another copy. Here the decoder runs
to hidden states once, then only the positions whose token is trained (``select``, usually
the loss mask) go through the LM head, ``chunk`` positions at a time. With gradients on,
each chunk is wrapped in activation checkpointing, so backward keeps only the chunk's hidden
states and recomputes its logits: peak logits memory is ``chunk x vocab x 4`` bytes (plus
its gradient), whatever the batch size.

Alignment (the loader's): ``out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``, computed
from the hidden state at ``t - 1``; ``out[b, 0] = 0`` and every unselected position is 0.
The head runs in fp32 when ``fp32_head`` (a plain ``nn.Linear`` head: hidden state and weight
are upcast; the fix for bf16 numerics mismatch, MiniMax-M1 / ScaleRL) or else in the model's
dtype with its output upcast; the logits are then softcapped like the model's own forward
(``final_logit_softcapping``, Gemma) and divided by ``temperature`` (the engine's sampling
temperature) before the log-softmax.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def causal_lm(model: Any) -> Any:
    """The transformers ``*ForCausalLM`` inside ``model`` (unwraps a PEFT model)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _softcap(model: Any) -> float | None:
    cap = getattr(causal_lm(model).config, "final_logit_softcapping", None)
    return float(cap) if cap else None


def hidden_states(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Last hidden states ``[B, T, H]`` of the decoder (no LM head)."""
    decoder = causal_lm(model).get_decoder()
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    h: torch.Tensor = out.last_hidden_state
    return h


def _head_logprobs(head: Callable[[torch.Tensor], torch.Tensor], softcap: float | None,
                   temperature: float, fp32_head: bool
                   ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    plain = type(head) is torch.nn.Linear  # a LoRA-wrapped head keeps its own forward

    def run(h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if fp32_head and plain:
            assert isinstance(head, torch.nn.Linear)
            bias = None if head.bias is None else head.bias.float()
            logits = torch.nn.functional.linear(h.float(), head.weight.float(), bias)
        else:
            logits = head(h).float()
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        if temperature != 1.0:
            logits = logits / temperature
        lp = logits.log_softmax(dim=-1)
        return lp.gather(-1, targets[:, None]).squeeze(-1)

    return run


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    select: torch.Tensor | None = None,
    chunk: int = 256,
    temperature: float = 1.0,
    fp32_head: bool = True,
) -> torch.Tensor:
    """``[B, T]`` fp32 log-probs of ``input_ids`` under ``model`` at the selected positions.

    ``select`` (``[B, T]``, non-zero = wanted) defaults to every real token after the first.
    Differentiable when grad mode is on (each LM-head chunk is checkpointed).
    """
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    want = attention_mask.bool() if select is None else select.bool() & attention_mask.bool()
    want = want.clone()
    want[:, 0] = False  # the first token has no prediction
    rows, cols = want.nonzero(as_tuple=True)
    hidden = hidden_states(model, input_ids, attention_mask)
    h = hidden[rows, cols - 1]  # [N, H]: the state that predicts token (row, col)
    targets = input_ids[rows, cols]
    run = _head_logprobs(causal_lm(model).get_output_embeddings(), _softcap(model), temperature,
                         fp32_head)
    grad = torch.is_grad_enabled()
    parts: list[torch.Tensor] = []
    for start in range(0, h.shape[0], chunk):
        hc, tc = h[start:start + chunk], targets[start:start + chunk]
        if grad:
            lp = checkpoint(run, hc, tc, use_reentrant=False)
            assert isinstance(lp, torch.Tensor)
            parts.append(lp)
        else:
            parts.append(run(hc, tc))
    values = torch.cat(parts) if parts else h.new_zeros(0, dtype=torch.float32)
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    return out.index_put((rows, cols), values)


def naive_token_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """Reference: full ``[B, T, V]`` logits, log-softmax, gather (0 at t = 0 and on padding)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    lp = (logits[:, :-1].float() / temperature).log_softmax(dim=-1)
    picked = lp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    out[:, 1:] = picked * attention_mask[:, 1:].to(torch.float32)
    return out
