"""Integration: one real vLLM CPU server (tiny model) shared by the module.

Exercises the real wire contract of :class:`VLLMClient` and the supervision of
:class:`ManagedServers`: token-id prompts, behaviour log-probs (checked against an
independent fp32 forward pass), abort, pause/resume, weight reload (outputs change, then
return exactly), LoRA, metrics, typed errors, and engine death + restart (last).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
from safetensors.numpy import load_file, save_file

from rollbank.errors import BadRequestError, InferenceError
from rollbank.inference.config import ServerConfig
from rollbank.inference.models import create_tiny_lora, ensure_model, load_tokenizer
from rollbank.inference.protocol import GenerateRequest, GenerateResult, SamplingParams
from rollbank.inference.publishing import CheckpointPublisher, WeightUpdate
from rollbank.inference.server import ManagedServers
from rollbank.inference.vllm_client import VLLMClient

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.asyncio(loop_scope="module"),
]

PROMPT = list(range(10, 210))  # > one KV block (vLLM CPU uses 128-token blocks)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ManagedServers]:
    run_dir = tmp_path_factory.mktemp("vllm-run")
    # fp32: vLLM CPU would otherwise serve the fp32 checkpoint in bf16.
    cfg = ServerConfig(model="tiny", dtype="float32", enable_lora=True, kv_cache_gib=1, run_dir=run_dir)
    async with ManagedServers(cfg) as ms:
        yield ms


@pytest.fixture(scope="module")
def client(servers: ManagedServers) -> VLLMClient:
    return servers.clients[0]


def greedy(rid: str, prompt: list[int] = PROMPT, n: int = 24, lora: str | None = None) -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_tokens=n, temperature=0.0), lora=lora)


async def test_token_ids_in_and_out(client: VLLMClient) -> None:
    a = await client.generate(greedy("t1"))
    b = await client.generate(greedy("t2"))
    assert a.prompt_tokens == len(PROMPT)
    assert len(a.token_ids) == 24 and a.finish_reason == "length"
    assert all(0 <= t < 2048 for t in a.token_ids)
    assert a.token_ids == b.token_ids  # greedy is deterministic
    tok = load_tokenizer(ensure_model("tiny"))
    assert a.text == tok.decode(a.token_ids)
    assert b.cached_prompt_tokens is not None and b.cached_prompt_tokens > 0
    assert a.timings.total_s > 0  # the scale-out endpoint reports no queue/prefill split
    assert client.scale_out is True and a.token_versions == [0] * 24  # engine label "default"


async def test_the_path_of_a_plain_vllm_serve(servers: ManagedServers, client: VLLMClient) -> None:
    """What ``--servers URL`` does with a standard ``vllm serve`` (no scale-out route, no engine
    versions): ``/v1/completions`` with token-id prompts, versions from rollbank's records,
    labelled; the same greedy tokens and log-probs as the scale-out route of the same engine."""
    from rollbank.inference_plane import ROLLBANK_VERSIONS, connect_external

    url = servers.urls[0].rstrip("/")
    into: dict[str, VLLMClient] = {}

    def plain(u: str, *, versions_from_engine: bool) -> VLLMClient:
        return VLLMClient(u, scale_out=False, versions_from_engine=versions_from_engine)

    labels = await connect_external([url], "rollbank", into, plain)
    try:
        assert labels == {url: ROLLBANK_VERSIONS} and into[url].scale_out is False
        got = await into[url].generate(greedy("plain-1"))
        ref = await client.generate(greedy("plain-ref"))
        assert got.token_ids == ref.token_ids and len(got.token_ids) == 24
        assert got.token_versions == [0] * 24  # rollbank's record: nothing published yet
        assert got.logprobs == pytest.approx(ref.logprobs, abs=1e-3)
    finally:
        await into[url].aclose()


async def test_logprobs_are_the_sampling_distribution(client: VLLMClient) -> None:
    """The returned log-probs equal log_softmax(logits / T) of an fp32 reference forward."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    temperature = 0.7
    r = await client.generate(
        GenerateRequest("lp", PROMPT, SamplingParams(max_tokens=16, temperature=temperature))
    )
    assert len(r.logprobs) == len(r.token_ids) == 16
    assert all(math.isfinite(x) and x <= 0.0 for x in r.logprobs)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(ensure_model("tiny")), dtype=torch.float32
    ).eval()
    ids = torch.tensor([PROMPT + r.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(PROMPT) - 1 : -1]
    ref = torch.log_softmax(logits / temperature, dim=-1)
    expected = ref[torch.arange(16), torch.tensor(r.token_ids)].tolist()
    assert np.allclose(r.logprobs, expected, atol=2e-3), (r.logprobs, expected)
    raw = torch.log_softmax(logits, dim=-1)[torch.arange(16), torch.tensor(r.token_ids)].tolist()
    assert not np.allclose(r.logprobs, raw, atol=2e-3)  # processed, not raw, log-probs


async def _abort_until_done(client: VLLMClient, task: asyncio.Task[GenerateResult], rid: str) -> None:
    while not task.done():
        await client.abort(rid)
        await asyncio.wait({task}, timeout=0.2)


async def test_abort_returns_partial_output(client: VLLMClient) -> None:
    req = GenerateRequest("long-1", [5, 6, 7], SamplingParams(max_tokens=2000, temperature=1.0))
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(client.generate(req))
        await _abort_until_done(client, task, "long-1")
    r = task.result()
    assert r.finish_reason == "abort"
    assert len(r.token_ids) < 2000 and len(r.logprobs) == len(r.token_ids)


async def test_pause_abort_and_resume(client: VLLMClient) -> None:
    req = GenerateRequest("long-2", [8, 9, 10], SamplingParams(max_tokens=2000, temperature=1.0))
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(client.generate(req))
        while not task.done():
            await client.pause("abort")
            await asyncio.wait({task}, timeout=0.2)
            if not task.done():
                await client.resume()
        assert await client.is_paused()
        waiting = tg.create_task(client.generate(greedy("while-paused", n=4)))
        done, _ = await asyncio.wait({waiting}, timeout=1.0)
        assert not done  # held while paused
        await client.resume()
    assert task.result().finish_reason == "abort"
    assert waiting.result().finish_reason == "length" and len(waiting.result().token_ids) == 4
    assert not await client.is_paused()


def _perturbed_copy(src: Path, dst: Path, scale: float = 0.5) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    rng = np.random.default_rng(99)
    out = {k: (v + rng.normal(0, scale * 0.08, v.shape).astype(v.dtype)) if "norm" not in k else v for k, v in tensors.items()}
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


async def test_reload_weights_changes_and_restores_outputs(
    servers: ManagedServers, client: VLLMClient, tmp_path: Path
) -> None:
    base_dir = ensure_model("tiny")
    before = await client.generate(greedy("w0"))
    new_dir = _perturbed_copy(base_dir, tmp_path / "ckpt-1")
    await client.pause("wait")
    await servers.reload_weights(str(new_dir), version=1)
    await client.reset_prefix_cache()
    await client.resume()
    changed = await client.generate(greedy("w1"))
    assert changed.policy_version == 1 and client.policy_version == 1
    assert changed.token_ids != before.token_ids
    await client.pause("wait")
    await servers.reload_weights(str(base_dir), version=2)
    await client.reset_prefix_cache()
    await client.resume()
    restored = await client.generate(greedy("w2"))
    assert restored.token_ids == before.token_ids
    assert restored.logprobs == before.logprobs
    assert restored.policy_version == 2


async def test_weight_publisher_on_a_real_server(
    servers: ManagedServers, client: VLLMClient, tmp_path: Path
) -> None:
    """The safe-order publisher against real vLLM: new version served, old one restored."""
    base_dir = ensure_model("tiny")
    before = await client.generate(greedy("p0"))
    pub = CheckpointPublisher(servers.clients, base_dir, plan="finish",
                              version=client.policy_version)
    ready = time.monotonic()
    new_dir = _perturbed_copy(base_dir, tmp_path / "ckpt-pub")
    report = await pub.publish(WeightUpdate(path=str(new_dir)), version=10, ready_at=ready)
    servers.remember_weights(str(new_dir), 10)
    after = await client.generate(greedy("p1"))
    assert after.policy_version == 10 and after.token_ids != before.token_ids
    assert report.publication_s >= report.apply_pause_s > 0
    print("publish:", report.to_dict())
    await pub.publish(WeightUpdate(path=str(base_dir)), version=11)
    servers.remember_weights(str(base_dir), 11)
    back = await client.generate(greedy("p2"))
    assert back.token_ids == before.token_ids and back.policy_version == 11


async def test_engine_versions_split_a_request_that_spans_a_weight_update(
    servers: ManagedServers, client: VLLMClient
) -> None:
    """pause("keep") mid-request, reload + name a new version, resume: the engine's spans
    say which tokens came from which version (the client's send-time version would say v0)."""
    v0 = client.policy_version
    v1 = v0 + 100
    req = GenerateRequest("span-1", [11, 12, 13], SamplingParams(max_tokens=300, min_tokens=300))
    before = (await client.metrics()).generation_tokens
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(client.generate(req))
        while True:  # until it is decoding
            if (await client.metrics()).generation_tokens >= before + 8:
                break
            await asyncio.sleep(0.05)
        await client.pause("keep", clear_cache=False)
        assert not task.done()
        await servers.reload_weights(str(ensure_model("tiny")), version=v1)
        await client.resume()
    r = task.result()
    assert len(r.token_ids) == len(r.token_versions) == len(r.logprobs) == 300
    k = r.token_versions.index(v1)
    assert k >= 8 and r.token_versions == [v0] * k + [v1] * (300 - k)
    assert r.policy_version == v1 == client.policy_version


async def test_a_request_held_by_admission_waits_then_carries_the_new_version(
    servers: ManagedServers, client: VLLMClient
) -> None:
    version = client.policy_version + 1
    base_dir = ensure_model("tiny")
    pub = CheckpointPublisher(servers.clients, base_dir, plan="finish", version=client.policy_version)
    gate = pub.fleet.gate
    publish = asyncio.create_task(pub.publish(WeightUpdate(path=str(base_dir)), version=version))
    while not publish.done():  # validated (off the loop), then the gate closes
        if not gate.is_open:
            break
        await asyncio.sleep(0.001)
    assert not gate.is_open
    held = asyncio.create_task(client.generate(greedy("held", n=8)))
    observed_while_closed: list[tuple[int, bool]] = []
    while not publish.done():
        if not gate.is_open:
            observed_while_closed.append((client.inflight, held.done()))
        await asyncio.sleep(0.01)
    await publish
    servers.remember_weights(str(base_dir), version)
    r = await held
    assert observed_while_closed and set(observed_while_closed) == {(0, False)}  # nothing sent
    assert r.token_versions == [version] * 8 and r.policy_version == version


async def test_lora_load_generate_unload(client: VLLMClient, tmp_path: Path) -> None:
    adapter = create_tiny_lora(ensure_model("tiny"), tmp_path / "lora-a")
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 8
    await client.load_lora("ad-a", str(adapter))
    base = await client.generate(greedy("l0"))
    with_lora = await client.generate(greedy("l1", lora="ad-a"))
    assert with_lora.token_ids != base.token_ids
    await client.unload_lora("ad-a")
    with pytest.raises(BadRequestError):
        await client.generate(greedy("l2", lora="ad-a"))


async def test_metrics_report_prefix_cache(client: VLLMClient) -> None:
    before = await client.metrics()
    prompt = list(range(300, 700))
    await client.generate(greedy("m1", prompt, n=2))
    second = await client.generate(greedy("m2", [*prompt, 5, 6], n=2))
    after = await client.metrics()
    assert second.cached_prompt_tokens is not None and second.cached_prompt_tokens >= 384
    assert after.prefix_cache_queries - before.prefix_cache_queries >= 400 + 402
    assert after.prefix_cache_hits - before.prefix_cache_hits >= 384
    assert after.generation_tokens >= before.generation_tokens + 4
    assert 0.0 < after.prefix_cache_hit_rate <= 1.0


async def test_bad_request_is_typed(client: VLLMClient) -> None:
    with pytest.raises(BadRequestError):
        await client.generate(greedy("too-long", [7] * 2100, n=10))
    # vLLM clamps max_tokens to the context left instead of refusing.
    near = await client.generate(greedy("near-end", [7] * 2044, n=100))
    assert near.finish_reason == "length" and len(near.token_ids) == 4


async def test_unreachable_is_typed() -> None:
    from rollbank.errors import ServerUnreachableError
    from rollbank.inference.server import free_port

    dead = VLLMClient(f"http://127.0.0.1:{free_port()}", connect_retries=1)
    try:
        with pytest.raises(ServerUnreachableError):
            await dead.generate(greedy("nobody"))
        assert not await dead.health()
    finally:
        await dead.aclose()


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


async def test_engine_death_is_detected_and_restarted(
    servers: ManagedServers, client: VLLMClient, tmp_path: Path
) -> None:
    """Kill the EngineCore process under the API server (what the per-request-seed bug of
    vLLM CPU 0.32 does, cpu-inference.md). Requests then fail as InferenceError; the
    supervisor restarts the server on the same URL and re-applies the last published
    weights, then the served LoRA adapter under its name, and the version (#10: a restarted
    engine lacked the adapter the LoRA pattern's requests name)."""
    adapter = create_tiny_lora(ensure_model("tiny"), tmp_path / "lora-r", seed=5)
    version = client.policy_version + 1
    await client.load_lora("served-v", str(adapter))
    await client.set_weight_version(version)
    servers.remember_adapter("served-v", str(adapter), version)
    served = await client.generate(greedy("served", n=4, lora="served-v"))
    proc = servers.servers[0].process
    assert proc is not None
    engines = _children(proc.pid)
    assert engines, "the API server has no engine child process"

    async def doomed() -> InferenceError | GenerateResult:
        try:
            return await client.generate(GenerateRequest("dying", [3, 4], SamplingParams(max_tokens=2000)))
        except InferenceError as exc:
            return exc

    async with asyncio.TaskGroup() as tg:
        inflight = tg.create_task(doomed())
        await asyncio.sleep(0.3)
        for pid in engines:
            os.kill(pid, signal.SIGKILL)
    # The request it was serving surfaces as an inference (infrastructure) error.
    assert isinstance(inflight.result(), InferenceError), inflight.result()
    with pytest.raises(InferenceError):
        await client.generate(greedy("after-death", n=4))
    # The background supervisor may get there first; check_now waits for it.
    for _ in range(servers.config.unhealthy_after + 1):
        await servers.check_now()
        if servers.servers[0].restarts:
            break
    assert servers.servers[0].restarts == 1
    assert [e["event"] for e in servers.events if e.get("server") == 0][-2:] == ["healthy", "restarted"]
    assert any(e["event"] == "dead" for e in servers.events)
    assert await client.health()
    r = await client.generate(greedy("reborn", n=4, lora="served-v"))
    assert r.token_ids == served.token_ids and r.token_versions == [version] * 4
    assert await client.engine_version() == version == client.policy_version
