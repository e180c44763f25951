"""SGLangClient against the recorded contract in tests/fixtures/sglang/contract.json.

The contract is hand-written from SGLang's documentation (SGLang cannot run here), so these
tests show the client speaks that contract — not that a real SGLang server agrees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollbank.errors import BadRequestError, InferenceError
from rollbank.inference.protocol import GenerateRequest, InferenceClient, SamplingParams
from rollbank.inference.sglang_client import SGLangClient

CONTRACT = json.loads((Path(__file__).parent.parent / "fixtures" / "sglang" / "contract.json").read_text())
EXCHANGES: dict[str, dict[str, Any]] = {e["name"]: e for e in CONTRACT["exchanges"]}


class ContractServer:
    """Answers only requests that match a recorded exchange exactly (method, path, body)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        for name, ex in EXCHANGES.items():
            r = ex["request"]
            if (r["method"], r["path"], r["json"]) == (request.method, request.url.path, body):
                self.seen.append(name)
                resp = ex["response"]
                if "json" in resp:
                    return httpx.Response(resp["status"], json=resp["json"])
                return httpx.Response(resp["status"], text=resp["text"])
        return httpx.Response(418, text=f"no recorded exchange for {request.method} {request.url.path} {body}")

    def client(self) -> SGLangClient:
        return SGLangClient("http://sglang:30000", transport=httpx.MockTransport(self))


async def test_generate_matches_contract() -> None:
    server = ContractServer()
    client: InferenceClient = server.client()
    res = await client.generate(
        GenerateRequest(
            "traj-1-turn-0",
            [2, 651, 6037, 235292],
            SamplingParams(max_tokens=3, temperature=0.7, stop=("\nTask:",)),
        )
    )
    assert server.seen == ["generate"]
    assert res.token_ids == [19178, 728, 522]
    assert res.logprobs == [-0.51, -1.25, -0.03]
    assert res.finish_reason == "length" and res.text == " ls -la"
    assert res.prompt_tokens == 4 and res.cached_prompt_tokens == 0
    assert res.timings.total_s == pytest.approx(0.042) and res.timings.prefill_s is None


async def test_lora_stop_and_abort_finish_reasons() -> None:
    server = ContractServer()
    c = server.client()
    stop = await c.generate(
        GenerateRequest("r-lora", [2, 651], SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(1,)), lora="adapter-a")
    )
    assert stop.finish_reason == "stop" and stop.token_ids == [1032, 1]
    aborted = await c.generate(GenerateRequest("r-abort", [5], SamplingParams(max_tokens=100)))
    assert aborted.finish_reason == "abort" and aborted.token_ids == [64]
    await c.abort("r-abort")
    assert server.seen == ["generate_lora_stop", "generate_aborted", "abort_request"]


async def test_control_plane_matches_contract() -> None:
    server = ContractServer()
    c = server.client()
    await c.pause("keep")
    assert await c.is_paused()
    await c.resume()
    assert not await c.is_paused()
    await c.reset_prefix_cache()
    await c.reload_weights("/ckpt/step-7", version=7)
    assert c.policy_version == 7
    await c.load_lora("adapter-a", "/loras/a")
    await c.unload_lora("adapter-a")
    assert await c.health()
    m = await c.metrics()
    assert (m.running, m.waiting) == (3, 1)
    assert m.prefix_cache_hit_rate == pytest.approx(0.6) and m.generation_tokens == 250
    assert server.seen == [
        "pause_generation", "continue_generation", "flush_cache", "update_weights_from_disk",
        "load_lora_adapter", "unload_lora_adapter", "health", "metrics",
    ]  # fmt: skip


async def test_wait_mode_is_refused_and_failed_update_keeps_version() -> None:
    c = ContractServer().client()
    with pytest.raises(BadRequestError, match="drain"):
        await c.pause("wait")
    failing = SGLangClient(
        "http://sglang:30000",
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"success": False, "message": "bad path"})),
    )
    with pytest.raises(InferenceError, match="bad path"):
        await failing.reload_weights("/nope", version=3)
    assert failing.policy_version == 0


async def test_mismatched_logprob_ids_are_rejected() -> None:
    data = json.loads(json.dumps(EXCHANGES["generate"]["response"]["json"]))
    data["meta_info"]["output_token_logprobs"][0][1] = 7
    c = SGLangClient("http://s", transport=httpx.MockTransport(lambda r: httpx.Response(200, json=data)))
    with pytest.raises(InferenceError, match="do not match"):
        await c.generate(GenerateRequest("x", [1], SamplingParams(max_tokens=3)))


def test_min_tokens_maps_to_min_new_tokens() -> None:
    c = SGLangClient("http://sglang:30000")
    body = c.generate_body(GenerateRequest("r", [5], SamplingParams(max_tokens=6, min_tokens=6)))
    assert body["sampling_params"]["min_new_tokens"] == 6
    plain = c.generate_body(GenerateRequest("r", [5], SamplingParams(max_tokens=6)))
    assert "min_new_tokens" not in plain["sampling_params"]
