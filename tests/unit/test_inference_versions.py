"""Issue 8, defect 5: versions from the engine, admission honoured by every sender, and
missing/non-finite log-probs rejected as inference errors.

The vLLM responses are in the shapes a real vLLM 0.32 server (``--enable-scale-out``) returned
here (see tests/integration/test_vllm_server.py for the same calls against the real thing).
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import torch
from episode_rig import rig, script

from rollbank.episodes.conversation import Conversation
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.errors import InferenceError, InvalidLogprobError, WeightVersionError
from rollbank.inference.engine_output import parse_version_label, version_label, versions_from_spans
from rollbank.inference.fake import FakeInferenceClient, FakeInferenceServer, FakeTokenizer
from rollbank.inference.protocol import (
    AdmissionGate,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
)
from rollbank.inference.publishing import CheckpointPublisher, WeightUpdate
from rollbank.inference.sglang_client import SGLangClient
from rollbank.inference.vllm_client import VLLMClient

SCALE_OUT = {
    "request_id": "generate-tokens-r1",
    "model": "tiny",
    "output_mode": "text",
    "choices": [
        {
            "index": 0,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": [1367, 1831, 1060],
            "text": " loggerconstexist",
            "logprobs": {"content": [
                {"token": " logger", "logprob": -3.02, "bytes": [32], "top_logprobs": []},
                {"token": "const", "logprob": -5.09, "bytes": [99], "top_logprobs": []},
                {"token": "exist", "logprob": -7.61, "bytes": [101], "top_logprobs": []},
            ]},
            "weight_versions": [{"version": "default", "start": 0, "end": 2}, {"version": "5", "start": 2, "end": 3}],
        }
    ],
    "usage": {"prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3,
              "prompt_tokens_details": {"cached_tokens": 0}},
}

COMPLETION = {
    "choices": [{"index": 0, "text": "abc", "finish_reason": "length", "token_ids": [1, 2, 3],
                 "logprobs": {"token_logprobs": [-1.0, -2.0, -3.0]}}],
    "usage": {"prompt_tokens": 3},
}


def _copy(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(d))
    return out


class Engine:
    """MockTransport handler: one canned generate answer, a scripted /weight_info sequence."""

    def __init__(self, answer: dict[str, Any] | str, *, labels: tuple[str, ...] = ("default",),
                 openapi_paths: tuple[str, ...] = ()) -> None:
        self.answer = answer
        self.labels = list(labels)
        self.openapi_paths = openapi_paths
        self.paths: list[str] = []
        self.bodies: list[Any] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        self.bodies.append(json.loads(request.content) if request.content else None)
        if request.url.path == "/weight_info":
            if not self.labels:
                return httpx.Response(404, json={"detail": "Not Found"})
            label = self.labels.pop(0) if len(self.labels) > 1 else self.labels[0]
            return httpx.Response(200, json={"weight_version": label})
        if request.url.path == "/openapi.json":
            return httpx.Response(200, json={"paths": {p: {} for p in self.openapi_paths}})
        if isinstance(self.answer, str):
            return httpx.Response(200, text=self.answer, headers={"content-type": "application/json"})
        return httpx.Response(200, json=self.answer)

    def client(self, **kw: Any) -> VLLMClient:
        return VLLMClient("http://srv:8000", transport=httpx.MockTransport(self), **kw)


SOLVE = "```bash\necho hello > out.txt\n```\n"


def req(rid: str = "r1", n: int = 3) -> GenerateRequest:
    return GenerateRequest(rid, [5, 6, 7], SamplingParams(max_tokens=n))


# ---------------------------------------------------------------- versions from the engine
async def test_scale_out_tokens_carry_the_engines_versions() -> None:
    engine = Engine(SCALE_OUT, openapi_paths=("/inference/v1/generate", "/v1/completions"))
    client = engine.client(policy_version=9)  # the client's own belief must not be used
    res = await client.generate(req())
    assert client.scale_out is True
    body = engine.bodies[engine.paths.index("/inference/v1/generate")]
    assert body["token_ids"] == [5, 6, 7] and body["request_id"] == "r1"
    assert body["output_mode"] == "text" and body["sampling_params"]["logprobs"] == 0
    assert body["sampling_params"]["max_tokens"] == 3 and "seed" not in body["sampling_params"]
    assert res.token_versions == [0, 0, 5] and res.policy_version == 5
    assert res.logprobs == [-3.02, -5.09, -7.61] and res.text == " loggerconstexist"
    assert res.cached_prompt_tokens == 0 and res.prompt_tokens == 3
    await client.abort("r1")
    assert engine.paths[-1] == "/inference/v1/abort_requests"
    assert engine.bodies[-1] == {"request_ids": ["generate-tokens-r1"]}


async def test_trajectory_records_which_version_generated_which_token() -> None:
    traj = Trajectory("t", "g", "task", 0)
    conv = Conversation(FakeTokenizer(), traj)
    conv.start("hi")
    engine = Engine(SCALE_OUT)
    conv.append_result(await engine.client(scale_out=True).generate(req()))
    assert traj.policy_versions[traj.prompt_len:] == [0, 0, 5]
    assert (traj.min_version, traj.max_version) == (0, 5)


async def test_fake_engine_tags_tokens_generated_after_a_reload_with_the_new_version() -> None:
    """Regression: a request frozen across a reload used to carry only its send-time version."""
    server = FakeInferenceServer(decode_s_per_token=0.0)
    client = FakeInferenceClient(server)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(client.generate(req("straddle", n=40)))
        await server.wait_until(lambda s: s.counters.generation_tokens >= 5)
        await client.pause("keep", clear_cache=False)
        await client.reload_weights("/ckpt/1", version=1)
        await client.resume()
    res = task.result()
    assert len(res.token_versions) == len(res.token_ids) == 40
    assert res.token_versions[0] == 0 and res.token_versions[-1] == 1 and res.policy_version == 1
    assert res.token_versions == sorted(res.token_versions)


async def test_completions_fallback_reads_the_engine_version_around_the_request() -> None:
    res = await Engine(COMPLETION, labels=("3", "3", "3")).client(scale_out=False).generate(req())
    assert res.token_versions == [3, 3, 3]
    changed = Engine(COMPLETION, labels=("3", "3", "4")).client(scale_out=False)
    with pytest.raises(WeightVersionError, match="changed from 3 to 4") as info:
        await changed.generate(req())
    assert info.value.request_id == "r1"


async def test_behind_a_third_party_router_versions_can_be_the_clients_own() -> None:
    """Only the routing benchmark's peer arm does this (no /weight_info behind vllm-router)."""
    engine = Engine(COMPLETION, labels=())
    res = await engine.client(scale_out=False, versions_from_engine=False, policy_version=2).generate(req())
    assert res.token_versions == [2, 2, 2] and "/weight_info" not in engine.paths


async def test_a_server_without_an_api_schema_falls_back_to_completions() -> None:
    class NoSchema(Engine):
        def __call__(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/openapi.json":
                return httpx.Response(404, json={"detail": "Not Found"})
            return super().__call__(request)

    client = NoSchema(COMPLETION, labels=("4",)).client()
    assert (await client.generate(req())).token_versions == [4, 4, 4] and client.scale_out is False


async def test_a_server_that_reports_no_version_is_refused_before_anything_is_sent() -> None:
    engine = Engine(COMPLETION, labels=(), openapi_paths=("/v1/completions",))
    client = engine.client()
    with pytest.raises(WeightVersionError, match="weight_info"):
        await client.connect()
    with pytest.raises(WeightVersionError):
        await client.generate(req())
    assert "/v1/completions" not in engine.paths
    with pytest.raises(WeightVersionError, match="'v7'"):
        await Engine(COMPLETION, labels=("v7",)).client(scale_out=False).connect()


async def test_reload_names_the_version_on_the_engine() -> None:
    engine = Engine({})
    client = engine.client(scale_out=True)
    await client.reload_weights("/ckpt/12", version=12)
    assert engine.paths == ["/collective_rpc", "/update_weight_version"]
    assert engine.bodies[-1] == {"new_version": "12"} and client.policy_version == 12


def test_version_labels_and_spans() -> None:
    assert parse_version_label("default") == 0 and parse_version_label("12") == 12
    for bad in ("v7", "-1", "", "1.5", None):
        with pytest.raises(WeightVersionError):
            parse_version_label(bad)
    assert versions_from_spans([], 0) == []
    for spans, n in (([], 2), ([{"version": "1", "start": 1, "end": 2}], 2),
                     ([{"version": "1", "start": 0, "end": 1}], 2)):
        with pytest.raises(WeightVersionError):
            versions_from_spans(spans, n)


async def test_scale_out_without_versions_is_refused() -> None:
    data = _copy(SCALE_OUT)
    data["choices"][0]["weight_versions"] = None
    with pytest.raises(WeightVersionError, match="no weight_versions"):
        await Engine(data).client(scale_out=True).generate(req())


# ---------------------------------------------------------------- admission gate
async def _spin(n: int = 50) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_vllm_client_sends_nothing_while_admission_is_closed() -> None:
    engine = Engine(SCALE_OUT)
    gate = AdmissionGate()
    client = engine.client(scale_out=True, admission=gate)
    await client.connect()
    gate.close()
    task = asyncio.create_task(client.generate(req()))
    await _spin()
    assert "/inference/v1/generate" not in engine.paths and not task.done()
    gate.open()
    assert (await task).token_versions == [0, 0, 5]


async def test_fake_client_waits_for_admission() -> None:
    server = FakeInferenceServer()
    client = FakeInferenceClient(server)
    client.admission.close()
    task = asyncio.create_task(client.generate(req()))
    await _spin()
    assert server.requests_seen == [] and not task.done()
    client.admission.open()
    assert len((await task).token_ids) == 3


async def test_publisher_gate_holds_every_client_and_the_held_request_gets_the_new_version(
        tmp_path: Path) -> None:
    from safetensors.torch import save_file

    ckpt = tmp_path / "v3"
    ckpt.mkdir()
    save_file({"w": torch.zeros(2)}, str(ckpt / "model.safetensors"))
    server = FakeInferenceServer(decode_s_per_token=0.0)
    fake = FakeInferenceClient(server)
    engine = Engine(SCALE_OUT, labels=(version_label(0), version_label(3)))  # reloaded: v3
    real = engine.client(scale_out=True)
    await real.connect()
    pub = CheckpointPublisher(cast(Any, [fake, real]), None, plan="finish")
    assert fake.admission is pub.fleet.gate and real.admission is pub.fleet.gate
    reached_server_while_closed: list[int] = []
    orig_pause = server.pause

    async def pause_and_send(mode: Any = "wait", *, clear_cache: bool = True) -> None:
        await orig_pause(mode, clear_cache=clear_cache)
        held.append(asyncio.create_task(fake.generate(req("held", n=4))))
        await _spin()
        reached_server_while_closed.append(len(server.requests_seen))

    held: list[asyncio.Task[GenerateResult]] = []
    server.pause = pause_and_send  # type: ignore[method-assign]
    await pub.publish(WeightUpdate(path=str(ckpt)), version=3)
    res = await held[0]
    assert reached_server_while_closed == [0]
    assert res.token_versions == [3, 3, 3, 3]


# ---------------------------------------------------------------- log-probs
@pytest.mark.parametrize(
    ("logprobs", "position"),
    [([-1.0, None, -3.0], 1), (None, 0), ([-1.0, -2.0, float("nan")], 2), ([-1.0, float("-inf"), -3.0], 1)],
)
async def test_completions_missing_or_non_finite_logprob_is_an_inference_error(
    logprobs: list[float | None] | None, position: int
) -> None:
    data = _copy(COMPLETION)
    if logprobs is None:
        del data["choices"][0]["logprobs"]
        text: dict[str, Any] | str = data
    else:
        data["choices"][0]["logprobs"]["token_logprobs"] = logprobs
        text = json.dumps(data, allow_nan=True)  # NaN / -Infinity as a server would write them
    with pytest.raises(InvalidLogprobError) as info:
        await Engine(text).client(scale_out=False).generate(req())
    assert isinstance(info.value, InferenceError)
    assert info.value.position == position and info.value.request_id == "r1"
    assert info.value.server == "http://srv:8000" and f"position {position}" in str(info.value)


@pytest.mark.parametrize("bad", [-9999.0, None])
async def test_scale_out_sentinel_or_missing_logprob_is_an_inference_error(bad: float | None) -> None:
    data = _copy(SCALE_OUT)
    data["choices"][0]["logprobs"]["content"][2]["logprob"] = bad
    with pytest.raises(InvalidLogprobError) as info:
        await Engine(data).client(scale_out=True).generate(req())
    assert info.value.position == 2 and info.value.request_id == "r1"


SGLANG = {"text": "ab", "output_ids": [7, 8], "meta_info": {
    "id": "r1", "finish_reason": {"type": "length"}, "prompt_tokens": 3, "weight_version": "2",
    "output_token_logprobs": [[-0.5, 7, None], [None, 8, None]]}}


async def test_sglang_missing_logprob_is_an_inference_error_and_versions_come_from_meta() -> None:
    with pytest.raises(InvalidLogprobError) as info:
        await SGLangClient("http://sg", transport=httpx.MockTransport(Engine(SGLANG))).generate(req())
    assert info.value.position == 1 and info.value.request_id == "r1"
    ok = _copy(SGLANG)
    ok["meta_info"]["output_token_logprobs"][1][0] = -0.25
    res = await SGLangClient("http://sg", transport=httpx.MockTransport(Engine(ok))).generate(req())
    assert res.token_versions == [2, 2] and res.logprobs == [-0.5, -0.25]


def test_trajectory_takes_one_version_per_token() -> None:
    traj = Trajectory("t", "g", "task", 0)
    traj.append_model([1, 2], [-1.0, -1.0], [3, 4])
    traj.append_model([5], [-1.0], 4)
    assert traj.policy_versions == [3, 4, 4]
    with pytest.raises(ValueError, match="versions"):
        traj.append_model([1, 2], [-1.0, -1.0], [3])


async def test_a_missing_logprob_ends_the_episode_as_infra_with_the_request_recorded() -> None:
    """End to end: the episode is an inference (infra) failure naming the request and position;
    no -inf reaches the trajectory (before: the None became -inf and the episode went on)."""
    data = _copy(SCALE_OUT)
    data["choices"][0]["logprobs"]["content"][1]["logprob"] = None
    async with rig(script(SOLVE, "DONE\n"), servers=1) as r:
        url = r.servers[0].base_url
        bad = VLLMClient(url, transport=httpx.MockTransport(Engine(data)), scale_out=True)
        r.runner.clients = {url: bad}
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.INFRA_FAILURE, Reason.INFERENCE_ERROR)
    error = t.outcome.evidence["error"]
    assert "InvalidLogprobError" in error and "position 1" in error and f"{t.trajectory_id}/t0" in error
    assert all(math.isfinite(x) for x in t.logprobs) and t.num_model_tokens == 0
