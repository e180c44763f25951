"""`rollbank numerics` scoring with a fake engine, and the prompt log-probs wire parser."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollbank.errors import InvalidLogprobError
from rollbank.inference.protocol import GenerateRequest, GenerateResult, Timings
from rollbank.inference.vllm_wire import parse_prompt_logprobs, prompt_logprobs_body
from rollbank.numerics.measure import Sequences, comparisons, engine_prefill, sample


def lp(token: int, position: int) -> float:
    """The fake engine's log-prob of ``token`` at ``position`` (any deterministic function)."""
    return -0.01 * token - 0.001 * position


class FakeEngine:
    """Samples tokens 100 + i; decode log-probs and prompt log-probs both follow :func:`lp`."""

    def __init__(self, sampled: int) -> None:
        self.sampled = sampled
        self.scored: list[list[int]] = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        n0 = len(request.prompt_token_ids)
        toks = [100 + i for i in range(self.sampled)]
        return GenerateResult(request.request_id, "fake", toks, [lp(t, n0 + i) for i, t in enumerate(toks)],
                              "length", "", n0, 0, Timings(total_s=0.0), token_versions=[0] * len(toks))

    async def prompt_logprobs(self, token_ids: list[int], *, request_id: str) -> list[float]:
        self.scored.append(list(token_ids))
        return [0.0] + [lp(t, i) for i, t in enumerate(token_ids) if i > 0]


def test_sequences_layout() -> None:
    seqs = Sequences([[1, 2, 3], [4]], [[7, 8], [9, 9, 9]])
    ids, attn, sampled = seqs.arrays()
    assert ids.tolist() == [[1, 2, 3, 7, 8], [4, 9, 9, 9, 0]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert sampled.astype(int).tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 0]]
    placed = seqs.place([[0.5, 0.25], [1.0, 2.0, 3.0]], sampled_only=True)
    assert placed.tolist() == [[0, 0, 0, 0.5, 0.25], [0, 1.0, 2.0, 3.0, 0]]
    tb = seqs.tensor_batch()
    assert tb.loss_mask.tolist() == sampled.astype(float).tolist()
    assert tb.prompt_lens.tolist() == [3, 1]


async def test_decode_and_prefill_line_up_on_the_sampled_tokens() -> None:
    engine = FakeEngine(sampled=3)
    seqs, decode = await sample(engine, [[1, 2], [3, 4, 5, 6]], max_tokens=3)
    prefill = await engine_prefill(engine, seqs, tag="e")
    assert engine.scored == [[1, 2, 100, 101, 102], [3, 4, 5, 6, 100, 101, 102]]
    _, _, sampled = seqs.arrays()
    assert np.allclose(decode[sampled], prefill[sampled])
    assert decode[1, 4] == pytest.approx(lp(100, 4)) and decode[1, :4].tolist() == [0.0] * 4
    # an "engine" one position off disagrees
    report = comparisons(seqs, {"engine-x-decode": decode, "engine-x-prefill": prefill,
                                "trainer-fp32": np.roll(prefill, 1, axis=1)}, behaviour="engine-x-decode")
    comps = report["comparisons"]
    assert comps["engine-x-prefill vs engine-x-decode"]["abs"]["max"] == pytest.approx(0.0)
    assert comps["trainer-fp32 vs engine-x-decode"]["abs"]["mean"] > 0.0
    assert report["alignment"]["baseline"] == "trainer-fp32 vs engine-x-decode"
    assert list(report["alignment"]["aligned"]) == ["trainer-fp32 vs engine-x-prefill"]


def test_prompt_logprobs_wire() -> None:
    body = prompt_logprobs_body([5, 6, 7], "m")
    assert body["prompt"] == [5, 6, 7] and body["prompt_logprobs"] == 0 and body["max_tokens"] == 1
    data = {"choices": [{"prompt_logprobs": [
        None,
        {"6": {"logprob": -1.5, "rank": 3}, "2": {"logprob": -0.1, "rank": 1}},
        {"7": {"logprob": -0.25, "rank": 1}},
    ]}]}
    assert parse_prompt_logprobs([5, 6, 7], data, server="s", request_id="r") == [0.0, -1.5, -0.25]
    with pytest.raises(ValueError):
        parse_prompt_logprobs([5, 6], data, server="s", request_id="r")
    missing = {"choices": [{"prompt_logprobs": [None, {"2": {"logprob": -0.1}}, {"7": {"logprob": -0.2}}]}]}
    with pytest.raises(InvalidLogprobError):
        parse_prompt_logprobs([5, 6, 7], missing, server="s", request_id="r")
    nan = {"choices": [{"prompt_logprobs": [None, {"6": {"logprob": math.nan}}, {"7": {"logprob": -0.2}}]}]}
    with pytest.raises(InvalidLogprobError):
        parse_prompt_logprobs([5, 6, 7], nan, server="s", request_id="r")


async def test_client_prompt_logprobs_over_http() -> None:
    import json

    import httpx

    from rollbank.errors import InferenceError
    from rollbank.inference.vllm_client import VLLMClient

    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if body["prompt"] == [1]:
            return httpx.Response(200, json={"choices": [{}]})  # malformed: no prompt_logprobs
        entries = [None] + [{str(t): {"logprob": -0.5 * i}} for i, t in enumerate(body["prompt"]) if i]
        return httpx.Response(200, json={"choices": [{"prompt_logprobs": entries}]})

    client = VLLMClient("http://engine", transport=httpx.MockTransport(handler), scale_out=True)
    try:
        assert await client.prompt_logprobs([3, 4, 5], request_id="r1") == [0.0, -0.5, -1.0]
        assert seen[0]["prompt_logprobs"] == 0 and seen[0]["prompt"] == [3, 4, 5]
        with pytest.raises(InferenceError, match="malformed prompt log-probs"):
            await client.prompt_logprobs([1], request_id="r2")
    finally:
        await client.aclose()
