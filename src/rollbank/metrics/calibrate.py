"""Measure the capacity terms of the lower bound against the real inference servers.

:func:`calibrate` sends a few probe requests and returns a :class:`Capacity`:
- ``ttft_floor_s``: a 1-token prompt with 1 generated token (request overhead);
- ``prefill_rate_single``: a long fresh prompt, 1 generated token, alone on one server;
- ``decode_rate_single``: a short prompt and ``decode_tokens`` generated, alone on one server;
- ``decode_rate_max`` / ``prefill_rate_max``: the same probes, ``concurrency`` at a time on
  every server at once (the servers share this machine's cores, so that is the real aggregate).

Prompts are random token ids unique per probe, so the prefix cache cannot help. Greedy
decoding with no stop condition except ``max_tokens`` is requested; a server that stops
early (end-of-sequence) is charged only for the tokens it produced. The probes take a few
seconds; they run before the collection clock starts.

Invariant: every rate is a measured maximum over the probes (never a guess); a bound built
from them is a bound *on this machine under this load*.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence

from rollbank.inference.protocol import GenerateRequest, InferenceClient, SamplingParams
from rollbank.metrics.bound import Capacity


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, vocab) for _ in range(n)]


async def _timed(client: InferenceClient, req: GenerateRequest) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    res = await client.generate(req)
    return time.perf_counter() - t0, len(res.token_ids), res.prompt_tokens


async def calibrate(
    clients: Mapping[str, InferenceClient],
    *,
    sandbox_slots: int,
    vocab_size: int,
    prefill_tokens: int = 512,
    decode_tokens: int = 64,
    concurrency: int = 8,
    seed: int = 1234,
    verifier_slots: int | None = None,
) -> Capacity:
    rng = random.Random(seed)
    vocab = max(vocab_size, 11)
    servers: Sequence[str] = list(clients)
    first = clients[servers[0]]
    n = [0]

    def req(prompt_len: int, max_tokens: int) -> GenerateRequest:
        n[0] += 1
        return GenerateRequest(f"calibrate-{seed}-{n[0]}", _prompt(rng, prompt_len, vocab),
                               SamplingParams(max_tokens=max_tokens, temperature=0.0))

    await _timed(first, req(8, 1))  # warm-up (first request compiles kernels)
    floor = min([(await _timed(first, req(1, 1)))[0] for _ in range(3)])
    t, _, p = await _timed(first, req(prefill_tokens, 1))
    prefill_single = p / max(t - floor, 1e-3)
    t, d, _ = await _timed(first, req(8, decode_tokens))
    decode_single = max(d - 1, 1) / max(t - floor, 1e-3)

    async def wave(prompt_len: int, max_tokens: int) -> tuple[float, int, int]:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(
            _timed(clients[s], req(prompt_len, max_tokens))
            for s in servers for _ in range(concurrency)
        ))
        return (time.perf_counter() - t0, sum(r[1] for r in results), sum(r[2] for r in results))

    t, _, p = await wave(prefill_tokens, 1)
    prefill_max = p / max(t - floor, 1e-3)
    t, d, _ = await wave(8, decode_tokens)
    decode_max = d / max(t - floor, 1e-3)
    return Capacity(
        decode_rate_single=decode_single,
        decode_rate_max=max(decode_max, decode_single),
        prefill_rate_single=prefill_single,
        prefill_rate_max=max(prefill_max, prefill_single),
        sandbox_slots=sandbox_slots,
        ttft_floor_s=floor,
        source="measured",
        verifier_slots=verifier_slots,
    )
