"""Unit tests for VLLMClient over httpx.MockTransport (the transport seam; no patching).

The canned responses have the shapes a real vLLM 0.32 server returned here (see
tests/integration/test_vllm_server.py for the same calls against the real thing).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from rollbank.errors import (
    BadRequestError,
    EngineDeadError,
    InferenceError,
    InferenceTimeoutError,
    ServerOverloadedError,
    ServerUnreachableError,
)
from rollbank.inference.protocol import GenerateRequest, InferenceClient, SamplingParams
from rollbank.inference.vllm_client import VLLMClient, parse_prometheus

Handler = Callable[[httpx.Request], httpx.Response]

COMPLETION = {
    "id": "cmpl-r1",
    "object": "text_completion",
    "model": "tiny",
    "choices": [
        {
            "index": 0,
            "text": " loggerconstexist",
            "logprobs": {
                "text_offset": [0, 7, 12],
                "token_logprobs": [-3.02, -5.09, -7.61],
                "tokens": [" logger", "const", "exist"],
                "top_logprobs": [{" logger": -3.02}, {"const": -5.09}, {"exist": -7.61}],
            },
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": [1367, 1831, 1060],
            "prompt_token_ids": [5, 6, 7],
        }
    ],
    "usage": {
        "prompt_tokens": 3,
        "total_tokens": 6,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 0},
    },
    "metrics": {
        "time_to_first_token_ms": 7.5,
        "generation_time_ms": 14.0,
        "queue_time_ms": 0.5,
        "mean_itl_ms": 7.0,
        "tokens_per_second": 140.0,
    },
}

METRICS_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 5.0
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 400.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 128.0
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 400.0
vllm:generation_tokens_total{engine="0",model_name="tiny"} 194.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7e9
"""


class Recorder:
    """A MockTransport handler that records requests and answers from a function.

    ``GET /weight_info`` (the engine's version, read around every ``/v1/completions``
    request) is answered with ``weight_version`` and not recorded, unless that is None.
    Clients speak the completions API (``scale_out=False``) unless told otherwise.
    """

    def __init__(self, answer: Handler, *, weight_version: str | None = "default") -> None:
        self.answer = answer
        self.weight_version = weight_version
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/weight_info" and self.weight_version is not None:
            return httpx.Response(200, json={"weight_version": self.weight_version})
        self.requests.append(request)
        return self.answer(request)

    def client(self, **kw: object) -> VLLMClient:
        kw.setdefault("scale_out", False)
        return VLLMClient("http://srv:8000", transport=httpx.MockTransport(self), **kw)  # type: ignore[arg-type]


def req(**sampling: object) -> GenerateRequest:
    return GenerateRequest("r1", [5, 6, 7], SamplingParams(**sampling))  # type: ignore[arg-type]


async def test_generate_sends_token_ids_and_parses_everything() -> None:
    rec = Recorder(lambda r: httpx.Response(200, json=COMPLETION), weight_version="4")
    client: InferenceClient = rec.client()
    res = await client.generate(req(max_tokens=3, temperature=0.7, stop=("\nTask:",), stop_token_ids=(2,)))
    sent = rec.requests[0]
    body = json.loads(sent.content)
    assert sent.url.path == "/v1/completions" and sent.headers["X-Request-Id"] == "r1"
    assert body["prompt"] == [5, 6, 7] and body["return_token_ids"] is True
    assert body["logprobs"] == 1 and body["max_tokens"] == 3 and body["temperature"] == 0.7
    assert body["stop"] == ["\nTask:"] and body["stop_token_ids"] == [2]
    assert "seed" not in body  # a per-request seed kills vLLM CPU 0.32
    assert "model" not in body and "min_tokens" not in body
    assert res.token_ids == [1367, 1831, 1060]
    assert res.logprobs == [-3.02, -5.09, -7.61]
    assert res.finish_reason == "length" and res.text == " loggerconstexist"
    assert res.prompt_tokens == 3 and res.cached_prompt_tokens == 0
    assert res.policy_version == 4 and res.server == "http://srv:8000"
    assert res.token_versions == [4, 4, 4]  # read from the engine (/weight_info), not the client
    assert res.timings.queue_s == pytest.approx(0.0005)
    assert res.timings.prefill_s == pytest.approx(0.0075)
    assert res.timings.decode_s == pytest.approx(0.014)
    assert res.timings.first_token_s == pytest.approx(0.008)


async def test_min_tokens_is_sent_only_when_set() -> None:
    rec = Recorder(lambda r: httpx.Response(200, json=COMPLETION))
    await rec.client().generate(req(max_tokens=3, min_tokens=3))
    assert json.loads(rec.requests[0].content)["min_tokens"] == 3


async def test_lora_is_sent_as_model_and_missing_metrics_are_none() -> None:
    data = json.loads(json.dumps(COMPLETION))
    del data["metrics"]
    del data["usage"]["prompt_tokens_details"]
    data["choices"][0]["finish_reason"] = "abort"
    rec = Recorder(lambda r: httpx.Response(200, json=data))
    res = await rec.client().generate(GenerateRequest("r1", [5, 6, 7], lora="ad-a"))
    assert json.loads(rec.requests[0].content)["model"] == "ad-a"
    assert res.finish_reason == "abort"
    assert res.timings.prefill_s is None and res.timings.queue_s is None
    assert res.cached_prompt_tokens is None


async def test_malformed_response_is_an_inference_error() -> None:
    data = json.loads(json.dumps(COMPLETION))
    data["choices"][0]["logprobs"]["token_logprobs"] = [-1.0]
    rec = Recorder(lambda r: httpx.Response(200, json=data))
    with pytest.raises(InferenceError, match="logprobs"):
        await rec.client().generate(req())


@pytest.mark.parametrize(
    ("status", "body", "health", "error"),
    [
        (400, '{"error": {"message": "Input length (2100) exceeds"}}', 200, BadRequestError),
        (404, '{"error": {"message": "The model `x` does not exist."}}', 200, BadRequestError),
        (422, "{}", 200, BadRequestError),
        (429, "{}", 200, ServerOverloadedError),
        (503, "{}", 200, ServerOverloadedError),
        (500, '{"error": {"message": "EngineCore encountered an issue."}}', 200, EngineDeadError),
        (500, '{"error": {"message": "boom"}}', 503, EngineDeadError),
        (500, '{"error": {"message": "boom"}}', 200, InferenceError),
    ],
)
async def test_http_errors_are_typed(status: int, body: str, health: int, error: type[Exception]) -> None:
    def answer(r: httpx.Request) -> httpx.Response:
        if r.url.path == "/health":
            return httpx.Response(health)
        return httpx.Response(status, text=body)

    rec = Recorder(answer)
    with pytest.raises(error) as info:
        await rec.client().generate(req())
    assert type(info.value) is error
    assert sum(r.url.path == "/v1/completions" for r in rec.requests) == 1  # never re-sent


async def test_connect_errors_are_retried_then_unreachable() -> None:
    def refuse(r: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=r)

    rec = Recorder(refuse)
    with pytest.raises(ServerUnreachableError):
        await rec.client(connect_retries=2).generate(req())
    assert len(rec.requests) == 3


async def test_connect_error_then_success_is_retried_once() -> None:
    calls = {"n": 0}

    def flaky(r: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ConnectError("refused", request=r)
        return httpx.Response(200, json=COMPLETION)

    res = await Recorder(flaky).client().generate(req())
    assert res.token_ids == [1367, 1831, 1060] and calls["n"] == 2


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (httpx.ReadTimeout, InferenceTimeoutError),
        (httpx.RemoteProtocolError, ServerUnreachableError),
        (httpx.ReadError, ServerUnreachableError),
    ],
)
async def test_failures_after_sending_are_not_retried(exc: type[httpx.TransportError], error: type[Exception]) -> None:
    def fail(r: httpx.Request) -> httpx.Response:
        raise exc("gone", request=r)

    rec = Recorder(fail)
    with pytest.raises(error):
        await rec.client().generate(req())
    assert len(rec.requests) == 1


async def test_control_plane_requests() -> None:
    def answer(r: httpx.Request) -> httpx.Response:
        if r.url.path == "/is_paused":
            return httpx.Response(200, json={"is_paused": True})
        if r.url.path == "/reset_prefix_cache":
            return httpx.Response(200, json={"success": True})
        if r.url.path == "/metrics":
            return httpx.Response(200, text=METRICS_TEXT)
        return httpx.Response(200, json={})

    rec = Recorder(answer)
    c = rec.client()
    await c.abort("r9")
    await c.pause("keep", clear_cache=False)
    assert await c.is_paused()
    await c.resume()
    await c.reset_prefix_cache()
    await c.reload_weights("/ckpt/7", version=7)
    await c.load_lora("ad", "/loras/ad")
    await c.unload_lora("ad")
    m = await c.metrics()
    seen = [(r.method, r.url.path, dict(r.url.params), json.loads(r.content) if r.content else None) for r in rec.requests]
    assert seen[:9] == [
        ("POST", "/abort_requests", {}, {"request_ids": ["cmpl-r9-0"]}),
        ("POST", "/pause", {"mode": "keep", "clear_cache": "false"}, None),
        ("GET", "/is_paused", {}, None),
        ("POST", "/resume", {}, None),
        ("POST", "/reset_prefix_cache", {}, None),
        ("POST", "/collective_rpc", {}, {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/7"}}),
        ("POST", "/update_weight_version", {}, {"new_version": "7"}),
        ("POST", "/v1/load_lora_adapter", {}, {"lora_name": "ad", "lora_path": "/loras/ad"}),
        ("POST", "/v1/unload_lora_adapter", {}, {"lora_name": "ad"}),
    ]
    assert c.policy_version == 7
    assert (m.running, m.waiting) == (2, 5)
    assert m.prefix_cache_queries == 400 and m.prefix_cache_hits == 128
    assert m.prompt_tokens == 400 and m.generation_tokens == 194
    assert m.prefix_cache_hit_rate == pytest.approx(0.32)


async def test_failed_reload_keeps_the_old_version() -> None:
    rec = Recorder(lambda r: httpx.Response(500, text='{"error": "no such file"}'))
    c = rec.client(policy_version=3)
    with pytest.raises(InferenceError):
        await c.reload_weights("/missing", version=4)
    assert c.policy_version == 3


async def test_reset_prefix_cache_retries_while_refused() -> None:
    answers = iter([False, False, True])
    rec = Recorder(lambda r: httpx.Response(200, json={"success": next(answers)}))
    await rec.client().reset_prefix_cache()
    assert len(rec.requests) == 3
    stubborn = Recorder(lambda r: httpx.Response(200, json={"success": False}))
    with pytest.raises(InferenceError, match="refused"):
        await stubborn.client().reset_prefix_cache(attempts=2)


async def test_health() -> None:
    assert await Recorder(lambda r: httpx.Response(200)).client().health()
    assert not await Recorder(lambda r: httpx.Response(503)).client().health()

    def refuse(r: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=r)

    assert not await Recorder(refuse).client().health()


def test_parse_prometheus_sums_label_sets() -> None:
    text = 'a_total{x="1"} 2\na_total{x="2"} 3.5\nb 7\n# comment\nweird{x="}"} 1\n'
    assert parse_prometheus(text) == {"a_total": 5.5, "b": 7.0, "weird": 1.0}
