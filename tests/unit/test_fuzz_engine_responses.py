"""Fuzzed engine answers into VLLMClient.generate (issue #13, item 3), over httpx.MockTransport.

A valid vLLM 0.32 answer (completions or scale-out shape) is mutated: fields replaced by any
JSON value (NaN and huge numbers included), deleted, token counts changed, the body truncated
or replaced by bytes. ``generate`` either returns a result a trajectory can hold (one finite
log-prob, one version and one non-negative integer id per token; sane counts and timings) or
raises an :class:`InferenceError` naming the request; nothing else.

``ROLLBANK_FUZZ_EXAMPLES=N`` raises the number of examples (the longer campaign).
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rollbank.errors import InferenceError, WeightVersionError
from rollbank.inference.engine_output import versions_from_spans
from rollbank.inference.protocol import GenerateRequest, GenerateResult, SamplingParams
from rollbank.inference.vllm_client import VLLMClient
from rollbank.inference.vllm_wire import COMPLETIONS, SCALE_OUT_GENERATE

FUZZ = int(os.environ.get("ROLLBANK_FUZZ_EXAMPLES", "0"))


def budget(n: int) -> settings:
    return settings(max_examples=FUZZ or n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


COMPLETION: dict[str, Any] = {
    "choices": [{"index": 0, "text": " a b c", "finish_reason": "length", "token_ids": [11, 12, 13],
                 "logprobs": {"token_logprobs": [-0.5, -1.5, -2.5]}}],
    "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}},
    "metrics": {"time_to_first_token_ms": 7.5, "generation_time_ms": 14.0, "queue_time_ms": 0.5},
}
SCALE_OUT: dict[str, Any] = {
    "choices": [{"index": 0, "text": " a b c", "finish_reason": "stop", "token_ids": [11, 12, 13],
                 "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.5}, {"logprob": -2.5}]},
                 "weight_versions": [{"version": "default", "start": 0, "end": 2},
                                     {"version": "3", "start": 2, "end": 3}]}],
    "usage": {"prompt_tokens": 3},
}
PATHS: list[tuple[Any, ...]] = [
    (), ("choices",), ("choices", 0), ("choices", 0, "token_ids"), ("choices", 0, "token_ids", 1),
    ("choices", 0, "logprobs"), ("choices", 0, "logprobs", "token_logprobs"),
    ("choices", 0, "logprobs", "token_logprobs", 2), ("choices", 0, "logprobs", "content"),
    ("choices", 0, "logprobs", "content", 1), ("choices", 0, "logprobs", "content", 1, "logprob"),
    ("choices", 0, "finish_reason"), ("choices", 0, "text"), ("choices", 0, "weight_versions"),
    ("choices", 0, "weight_versions", 0), ("choices", 0, "weight_versions", 0, "end"),
    ("choices", 0, "weight_versions", 1, "start"), ("choices", 0, "weight_versions", 1, "version"),
    ("usage",), ("usage", "prompt_tokens"), ("usage", "prompt_tokens_details"),
    ("usage", "prompt_tokens_details", "cached_tokens"), ("metrics",),
    ("metrics", "queue_time_ms"), ("metrics", "generation_time_ms"),
]
DELETE = object()
LEAF = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**20), max_value=10**400),
                 st.sampled_from([0, 1, 2, 3, 4, -1, 10**12]),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10),
                 st.sampled_from(["default", "3", "v7", "-1", "stop", "length", "abort", "1e3"]))
VALUE = st.recursive(LEAF, lambda c: st.lists(c, max_size=4) | st.dictionaries(
    st.sampled_from(["logprob", "start", "end", "version", "token_ids", "x"]), c, max_size=4), max_leaves=10)
MUTATION = st.tuples(st.sampled_from(PATHS), VALUE | st.just(DELETE))


def mutate(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return doc if value is DELETE else value
    node = doc
    for key in path[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return doc  # the path no longer exists after an earlier mutation
    last = path[-1]
    try:
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    except (KeyError, IndexError, TypeError):
        pass
    return doc


def body_bytes(doc: Any, cut: float | None, raw: bytes | None) -> bytes:
    if raw is not None:
        return raw
    text = json.dumps(doc).encode()  # NaN / Infinity as Python writes them (vLLM can too)
    return text if cut is None else text[: int(len(text) * cut)]


def run(scale_out: bool, body: bytes, *, logprobs: bool = True) -> GenerateResult:
    path = SCALE_OUT_GENERATE if scale_out else COMPLETIONS

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/weight_info":
            return httpx.Response(200, json={"weight_version": "2"})
        assert request.url.path == path
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    async def go() -> GenerateResult:
        client = VLLMClient("http://srv:8000", transport=httpx.MockTransport(answer), scale_out=scale_out)
        try:
            return await client.generate(GenerateRequest("r1", [5, 6, 7], SamplingParams(logprobs=logprobs)))
        finally:
            await client.aclose()

    return asyncio.run(go())


def check_result(res: GenerateResult, *, logprobs: bool) -> None:
    n = len(res.token_ids)
    assert all(type(t) is int and t >= 0 for t in res.token_ids)
    assert len(res.token_versions) == n and all(type(v) is int and v >= 0 for v in res.token_versions)
    if logprobs:
        assert len(res.logprobs) == n and all(math.isfinite(lp) for lp in res.logprobs)
    assert res.finish_reason in ("stop", "length", "abort")
    assert type(res.prompt_tokens) is int and res.prompt_tokens >= 0
    assert res.cached_prompt_tokens is None or (type(res.cached_prompt_tokens) is int
                                                and res.cached_prompt_tokens >= 0)
    for t in (res.timings.queue_s, res.timings.prefill_s, res.timings.decode_s, res.timings.first_token_s):
        assert t is None or (math.isfinite(t) and t >= 0)
    assert isinstance(res.text, str) and isinstance(res.policy_version, int)


def fuzz_once(scale_out: bool, mutations: list[tuple[tuple[Any, ...], Any]], cut: float | None,
              raw: bytes | None, logprobs: bool) -> None:
    doc = copy.deepcopy(SCALE_OUT if scale_out else COMPLETION)
    for path, value in mutations:
        doc = mutate(doc, path, value)
    try:
        res = run(scale_out, body_bytes(doc, cut, raw), logprobs=logprobs)
    except InferenceError as exc:
        assert exc.request_id == "r1" and exc.server == "http://srv:8000"
        return
    check_result(res, logprobs=logprobs)


CUT = st.none() | st.floats(min_value=0.0, max_value=0.999)
RAW = st.none() | st.binary(max_size=64) | st.sampled_from([b"", b"null", b"[]", b'"x"', b"\xff\xfe{}", b"{" * 5000])


@budget(200)
@given(st.booleans(), st.lists(MUTATION, max_size=4), CUT, RAW, st.booleans())
@example(True, [(("choices", 0, "logprobs", "content", 1), 5)], None, None, True)  # was AttributeError
@example(True, [(("choices", 0, "token_ids", 1), math.inf)], None, None, True)  # was OverflowError
@example(False, [(("choices", 0, "token_ids", 1), 1.7)], None, None, True)  # was token 1 (truncated)
@example(False, [(("choices", 0, "logprobs", "token_logprobs", 2), 10**400)], None, None, True)
@example(False, [(("usage",), [1])], None, None, True)  # was AttributeError
@example(False, [(("metrics", "queue_time_ms"), math.nan)], None, None, True)  # was NaN timings
@example(True, [(("choices", 0, "weight_versions", 1, "end"), 10**12)], None, None, True)  # was a 10^12 list
def test_generate_ends_in_a_result_or_an_inference_error(
    scale_out: bool, mutations: list[tuple[tuple[Any, ...], Any]], cut: float | None, raw: bytes | None,
    logprobs: bool,
) -> None:
    fuzz_once(scale_out, mutations, cut, raw, logprobs)


def test_the_unmutated_answers_parse() -> None:  # the fuzz base is valid: mutations cause the errors
    check_result(run(False, json.dumps(COMPLETION).encode()), logprobs=True)
    res = run(True, json.dumps(SCALE_OUT).encode())
    check_result(res, logprobs=True)
    assert res.token_versions == [0, 0, 3]


# ------------------------------------------------------------ regressions (minimal examples)
@pytest.mark.parametrize("scale_out, path, value", [
    (True, ("choices", 0, "logprobs", "content", 1), 5),  # AttributeError: 'int' has no .get
    (True, ("choices", 0, "token_ids", 1), math.inf),  # OverflowError from int(inf)
    (False, ("choices", 0, "token_ids", 1), 1.7),  # silently became token 1
    (False, ("choices", 0, "token_ids", 1), -4),  # a negative token id went through
    (False, ("choices", 0, "logprobs", "token_logprobs", 2), 10**400),  # OverflowError
    (False, ("usage",), [1]),  # AttributeError
    (False, ("usage", "prompt_tokens"), -3),  # a negative prompt count went through
    (False, ("metrics", "queue_time_ms"), math.nan),  # NaN timings went through
])
def test_malformed_answers_are_inference_errors(scale_out: bool, path: tuple[Any, ...], value: Any) -> None:
    doc = mutate(copy.deepcopy(SCALE_OUT if scale_out else COMPLETION), path, value)
    with pytest.raises(InferenceError, match=r"malformed|log-prob") as info:
        run(scale_out, json.dumps(doc).encode())
    assert info.value.request_id == "r1"


def test_a_huge_version_span_is_refused_before_it_is_expanded() -> None:
    # was: [0] * 10**12 materialised (MemoryError or a hang) before the length check
    with pytest.raises(WeightVersionError, match="tile"):
        versions_from_spans([{"version": "1", "start": 0, "end": 10**12}], 3, request_id="r1")


def test_openapi_paths_of_a_wrong_type_mean_no_scale_out() -> None:
    # was: TypeError ("argument of type 'int' is not iterable") out of connect()
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi.json":
            return httpx.Response(200, json={"paths": 5})
        return httpx.Response(200, json={"weight_version": "default"})

    async def go() -> bool | None:
        client = VLLMClient("http://srv:8000", transport=httpx.MockTransport(answer))
        await client.connect()
        await client.aclose()
        return client.scale_out

    assert asyncio.run(go()) is False
