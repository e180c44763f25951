"""Sampling from a policy version in-process, and rows -> a trainer :class:`TensorBatch`.

The learning bench samples from the trainer's own weights (a frozen copy per published
version, :class:`VersionStore`) instead of a vLLM server: on the 2-core host a vLLM round trip
per step costs more than the whole tiny-model step (see docs/learning.md). Behaviour log-probs
are the sampling copy's :func:`~rollbank.training.logprobs.token_logprobs` of the sampled
tokens (the trainer's own function), so a fresh trajectory's divergence is exactly 0 and a
stale one's is pure staleness (no engine/trainer numerics in it).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rollbank.batching.loader import TensorBatch
from rollbank.training.logprobs import token_logprobs
from rollbank_bench.learning.tasks import AdditionTask, verify

BOS, EOS, PAD = 1, 2, 0


class TextCodec:
    """The model folder's tokenizer.json: prompt ids (BOS first) and completion text."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def prompt_ids(self, text: str) -> list[int]:
        return [BOS, *self._tok.encode(text, add_special_tokens=False).ids]

    def ids(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def completion_text(self, ids: Sequence[int]) -> str:
        body = [i for i in ids if i not in (EOS, PAD)]
        return str(self._tok.decode(body, skip_special_tokens=True))


@dataclass(frozen=True)
class Sample:
    """One sampled attempt at a task by policy ``version``."""

    task: AdditionTask
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    version: int
    reward: float
    text: str


class VersionStore:
    """Frozen copies of the policy by version (the "engine" weights of the in-process sampler).

    ``publish(version, model)`` keeps an eval-mode, no-grad copy; versions older than
    ``keep`` behind the newest are evicted.
    """

    def __init__(self, keep: int) -> None:
        self.keep = max(keep, 0)
        self._models: dict[int, Any] = {}

    def publish(self, version: int, model: Any) -> None:
        frozen = copy.deepcopy(model).eval().requires_grad_(False)
        self._models[version] = frozen
        for v in [v for v in self._models if v < version - self.keep]:
            del self._models[v]

    def get(self, version: int) -> Any:
        return self._models[version]

    @property
    def newest(self) -> int:
        return max(self._models)


@torch.no_grad()
def sample(model: Any, codec: TextCodec, tasks: Sequence[AdditionTask], *, version: int,
           seed: int, max_new_tokens: int, temperature: float = 1.0) -> list[Sample]:
    """One completion per task (pure sampling at ``temperature``, no top-k/top-p), verified."""
    prompts = [codec.prompt_ids(t.prompt) for t in tasks]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.int64)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding for generation
        ids[i, width - len(p):] = torch.tensor(p)
        attn[i, width - len(p):] = 1
    torch.manual_seed(seed)
    out = model.generate(
        input_ids=ids, attention_mask=attn, do_sample=True, temperature=temperature, top_k=0,
        top_p=1.0, max_new_tokens=max_new_tokens, eos_token_id=EOS, pad_token_id=PAD,
    )
    samples = []
    for i, task in enumerate(tasks):
        gen = out[i, width:].tolist()
        if EOS in gen:
            gen = gen[: gen.index(EOS) + 1]
        text = codec.completion_text(gen)
        samples.append(Sample(task, tuple(prompts[i]), tuple(gen), version, verify(task, text), text))
    return samples


def to_batch(samples: Sequence[Sample], advantages: Sequence[float], group_of: Sequence[int],
             ids: Sequence[str]) -> TensorBatch:
    """Right-padded rows (prompt, then the sampled tokens under the loss mask); old_logprobs
    are zeros here (:func:`behaviour_logprobs` fills them)."""
    rows = [list(s.prompt_ids) + list(s.completion_ids) for s in samples]
    width = max(len(r) for r in rows)
    n = len(rows)
    input_ids = torch.full((n, width), PAD, dtype=torch.int64)
    attn = torch.zeros((n, width), dtype=torch.int64)
    mask = torch.zeros((n, width), dtype=torch.float32)
    versions = torch.full((n, width), -1, dtype=torch.int32)
    for i, (s, r) in enumerate(zip(samples, rows, strict=True)):
        input_ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        mask[i, len(s.prompt_ids): len(r)] = 1.0
        versions[i, len(s.prompt_ids): len(r)] = s.version
    return TensorBatch(
        input_ids=input_ids, attention_mask=attn, loss_mask=mask,
        old_logprobs=torch.zeros((n, width), dtype=torch.float32), policy_versions=versions,
        advantages=torch.tensor(list(advantages), dtype=torch.float32),
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32),
        prompt_lens=torch.tensor([len(s.prompt_ids) for s in samples], dtype=torch.int64),
        group_index=torch.tensor(list(group_of), dtype=torch.int64), trajectory_ids=tuple(ids),
    )


@torch.no_grad()
def behaviour_logprobs(store: VersionStore, batch: TensorBatch, versions: Sequence[int],
                       temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]`` log-probs of each row's sampled tokens under the version that sampled it."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    for v in sorted(set(versions)):
        rows = torch.tensor([i for i, x in enumerate(versions) if x == v])
        out[rows] = token_logprobs(
            store.get(v), batch.input_ids[rows], batch.attention_mask[rows],
            select=batch.loss_mask[rows], temperature=temperature,
        )
    return out


def canonical_completion(codec: TextCodec, task: AdditionTask, max_new_tokens: int) -> list[int]:
    """The token ids the sampler emits when it writes the correct action the way the warm-up
    taught it (the action's tokens, then EOS), cut at ``max_new_tokens`` like a sample."""
    return [*codec.ids(task.action), EOS][:max_new_tokens]


@torch.no_grad()
def expected_solve_rates(model: Any, codec: TextCodec, tasks: Sequence[AdditionTask], *,
                         max_new_tokens: int, temperature: float = 1.0) -> list[float]:
    """Per task, the probability that one sample at ``temperature`` is the canonical correct
    completion (:func:`canonical_completion`): the expected reward of one attempt without
    sampling noise, up to other spellings of the right answer (a lower bound; measured: 121 of
    122 sampled successes of the warmed-up model were canonical)."""
    rows = [Sample(t, tuple(codec.prompt_ids(t.prompt)),
                   tuple(canonical_completion(codec, t, max_new_tokens)), 0, 1.0, "")
            for t in tasks]
    n = len(rows)
    batch = to_batch(rows, [0.0] * n, list(range(n)), [str(i) for i in range(n)])
    lp = token_logprobs(model, batch.input_ids, batch.attention_mask, select=batch.loss_mask,
                        temperature=temperature)
    return [float(v) for v in torch.exp((lp * batch.loss_mask).sum(dim=1))]
