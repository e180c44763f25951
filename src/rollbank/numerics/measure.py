"""Score the same sampled tokens with the engine and the trainer (``rollbank numerics``).

Sources of per-token log-probs, all over the same sequences (``prompt + sampled``; only the
sampled tokens are compared):

- ``engine-<dtype>-decode``: the log-probs the sampling engine returned with the tokens (what
  a batch carries as behaviour log-probs). Only the first engine samples.
- ``engine-<dtype>-prefill``: an engine scoring the whole sequence with prompt log-probs
  (:meth:`VLLMClient.prompt_logprobs`): its dtype and kernels, prefill path.
- ``trainer-fp32``, ``trainer-bf16-fp32head``, ``trainer-bf16``: :meth:`Trainer.logprobs`
  (the chunked head of :mod:`rollbank.training.logprobs`) with ``dtype`` float32 / bfloat16
  and the LM head in fp32 or in the model's dtype.

:func:`comparisons` pairs them (:func:`rollbank.numerics.report.compare`). Engines are the
:class:`EngineScorer` seam (a :class:`VLLMClient` satisfies it); trainer scoring is blocking
and runs outside the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch

from rollbank.batching.loader import TensorBatch
from rollbank.inference.protocol import GenerateRequest, GenerateResult, SamplingParams
from rollbank.numerics.report import alignment_summary, compare

FloatArray = npt.NDArray[np.float64]

PROMPTS: tuple[str, ...] = (
    "The history of the printing press begins",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Question: A train travels 120 km in 1.5 hours. What is its average speed?\nAnswer:",
    "Dear hiring manager, I am writing to apply for",
    "#!/bin/bash\n# Find every file larger than 10 MB under /var/log and",
    "In quantum mechanics, the uncertainty principle states that",
    "Ingredients: 2 cups flour, 1 cup sugar, 3 eggs. Instructions:",
    "SELECT name, COUNT(*) FROM orders JOIN customers ON",
    "The three most important causes of the French Revolution were",
    "Once upon a time, in a village at the edge of a forest,",
    "import numpy as np\n\n# Compute the eigenvalues of a symmetric matrix\n",
    "Summary of the meeting notes:\n1.",
    "La capitale de la France est",
    "To configure a static IP address on Ubuntu, open the file",
    "The derivative of x^3 * sin(x) with respect to x is",
    "User: Can you explain what a hash table is?\nAssistant:",
)

TRAINER_VARIANTS: dict[str, tuple[str, bool]] = {  # name -> (dtype, fp32 LM head)
    "trainer-fp32": ("float32", True),
    "trainer-bf16-fp32head": ("bfloat16", True),
    "trainer-bf16": ("bfloat16", False),
}
BASELINE_TRAINER = "trainer-fp32"  # TrainerConfig's default


class EngineScorer(Protocol):
    """What :func:`sample` and :func:`engine_prefill` need from an engine."""

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...

    async def prompt_logprobs(self, token_ids: list[int], *, request_id: str) -> list[float]: ...


@dataclass(frozen=True)
class Sequences:
    """Prompts and the tokens an engine sampled after each (row ``i`` = ``prompts[i] +
    sampled[i]``), laid out as right-padded ``[B, T]`` arrays by :meth:`arrays`."""

    prompts: list[list[int]]
    sampled: list[list[int]]

    @property
    def width(self) -> int:
        return max((len(p) + len(s) for p, s in zip(self.prompts, self.sampled, strict=True)), default=1)

    def rows(self) -> list[list[int]]:
        return [p + s for p, s in zip(self.prompts, self.sampled, strict=True)]

    def arrays(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """``(token_ids, attention, sampled_mask)``, each ``[B, T]`` (padding: id 0, mask 0)."""
        b, t = len(self.prompts), self.width
        ids = np.zeros((b, t), dtype=np.int64)
        attn = np.zeros((b, t), dtype=np.int64)
        sampled = np.zeros((b, t), dtype=np.bool_)
        for i, (p, s) in enumerate(zip(self.prompts, self.sampled, strict=True)):
            ids[i, : len(p) + len(s)] = p + s
            attn[i, : len(p) + len(s)] = 1
            sampled[i, len(p): len(p) + len(s)] = True
        return ids, attn, sampled

    def place(self, per_row: Sequence[Sequence[float]], *, sampled_only: bool) -> FloatArray:
        """``[B, T]`` from per-row values: over the sampled tokens, or over the whole row."""
        out = np.zeros((len(self.prompts), self.width), dtype=np.float64)
        for i, (p, values) in enumerate(zip(self.prompts, per_row, strict=True)):
            start = len(p) if sampled_only else 0
            out[i, start: start + len(values)] = values
        return out

    def tensor_batch(self) -> TensorBatch:
        """The rows as a :class:`TensorBatch` whose loss mask is the sampled tokens."""
        ids, attn, sampled = self.arrays()
        b, t = ids.shape
        return TensorBatch(
            input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(attn),
            loss_mask=torch.from_numpy(sampled.astype(np.float32)),
            old_logprobs=torch.zeros((b, t), dtype=torch.float32),
            policy_versions=torch.full((b, t), -1, dtype=torch.int32),
            advantages=torch.zeros(b), rewards=torch.zeros(b),
            prompt_lens=torch.tensor([len(p) for p in self.prompts], dtype=torch.int64),
            group_index=torch.arange(b, dtype=torch.int64),
            trajectory_ids=tuple(f"row-{i}" for i in range(b)),
        )


async def sample(engine: EngineScorer, prompts: Sequence[list[int]], *, max_tokens: int,
                 temperature: float = 1.0) -> tuple[Sequences, FloatArray]:
    """Sample ``max_tokens`` after every prompt (concurrently); the sequences and the decode
    log-probs the engine returned, ``[B, T]`` over the sampled tokens."""
    sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=1.0, logprobs=True)
    results = await asyncio.gather(*(
        engine.generate(GenerateRequest(f"numerics-sample-{i}", list(p), sp))
        for i, p in enumerate(prompts)))
    seqs = Sequences([list(p) for p in prompts], [list(r.token_ids) for r in results])
    return seqs, seqs.place([r.logprobs for r in results], sampled_only=True)


async def engine_prefill(engine: EngineScorer, seqs: Sequences, *, tag: str) -> FloatArray:
    """``[B, T]``: the engine's prompt log-prob of every token of every row (0 at t = 0)."""
    values = await asyncio.gather(*(
        engine.prompt_logprobs(row, request_id=f"numerics-{tag}-{i}")
        for i, row in enumerate(seqs.rows())))
    return seqs.place(values, sampled_only=False)


def trainer_logprobs(model: str, seqs: Sequences, *, dtype: str, fp32_head: bool,
                     threads: int | None = None) -> FloatArray:
    """``[B, T]`` :meth:`Trainer.logprobs` of the sampled tokens (blocking: not on the loop)."""
    from rollbank.training.config import TrainerConfig
    from rollbank.training.trainer import Trainer

    cfg = TrainerConfig(model=model, finetune="full", dtype=dtype,  # type: ignore[arg-type]
                        fp32_lm_head=fp32_head, threads=threads, micro_batch_size=4)
    trainer = Trainer.load(cfg)
    out = trainer.logprobs(seqs.tensor_batch())
    del trainer
    return np.asarray(out.numpy(), dtype=np.float64)


def comparisons(seqs: Sequences, sources: dict[str, FloatArray], *,
                behaviour: str | None) -> dict[str, Any]:
    """Every (trainer vs engine), engine-vs-engine and trainer-vs-trainer pair of ``sources``
    over the sampled tokens, and the alignment summary against ``behaviour`` (the sampling
    engine's decode log-probs)."""
    ids, _, sampled = seqs.arrays()
    engines = [k for k in sources if k.startswith("engine-")]
    trainers = [k for k in sources if k.startswith("trainer-")]
    pairs: list[tuple[str, str]] = [(e, t) for e in engines for t in trainers]
    pairs += [(a, b) for i, a in enumerate(engines) for b in engines[i + 1:]]
    pairs += [(a, b) for i, a in enumerate(trainers) for b in trainers[i + 1:]]
    out: dict[str, dict[str, Any]] = {}
    for ref, cand in pairs:
        report = compare(sources[ref], sources[cand], sampled, ids)
        out[f"{cand} vs {ref}"] = {"reference": ref, "candidate": cand, **report}
    result: dict[str, Any] = {"comparisons": out}
    baseline = f"{BASELINE_TRAINER} vs {behaviour}"
    if behaviour is not None and baseline in out:
        aligned = [k for k, v in out.items() if k != baseline and v["candidate"].startswith("trainer-")]
        result["alignment"] = alignment_summary(out, baseline, aligned)
    return result
