"""Integration: the publication patterns on one real vLLM CPU server (tiny model).

Each pattern must make the engine produce exactly what the published weights give: the
sampled tokens' log-probs are compared with an fp32 transformers forward of the same
weights; restoring the old weights restores the old greedy outputs; a mismatched
publication is refused with the engine still on its version. The colocated pattern (an
in-process engine) is in test_publishing_colocated.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from rollbank.errors import WeightMismatchError
from rollbank.inference.config import ServerConfig
from rollbank.inference.models import create_tiny_lora, ensure_model
from rollbank.inference.protocol import GenerateRequest, GenerateResult, SamplingParams
from rollbank.inference.publishing import (
    CheckpointPublisher,
    DirectPublisher,
    LoraPublisher,
    ServedWeights,
    WeightUpdate,
)
from rollbank.inference.server import ManagedServers
from rollbank.inference.vllm_client import VLLMClient

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

PROMPT = list(range(10, 150))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ManagedServers]:
    cfg = ServerConfig(model="tiny", dtype="float32", enable_lora=True, kv_cache_gib=1,
                       weight_transfer_backend="rollbank_shm",
                       run_dir=tmp_path_factory.mktemp("vllm-publish"))
    async with ManagedServers(cfg) as ms:
        yield ms


@pytest.fixture(scope="module")
def client(servers: ManagedServers) -> VLLMClient:
    return servers.clients[0]


def base_state() -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(str(ensure_model("tiny") / "model.safetensors")))


def perturbed(state: dict[str, Any], *, only: str | None = None, seed: int = 1) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {n: t + 0.04 * torch.randn(t.shape, generator=g) if "norm" not in n and (only is None or only in n)
            else t for n, t in state.items()}


def reference_logprobs(state: dict[str, Any], tokens: list[int], adapter: Path | None = None) -> list[float]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ensure_model("tiny")), dtype=torch.float32)
    model.load_state_dict(state)
    if adapter is not None:
        import peft

        model = peft.PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    ids = torch.tensor([PROMPT + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(PROMPT) - 1 : -1]
    lp = torch.log_softmax(logits.float(), dim=-1)
    return [float(x) for x in lp[torch.arange(len(tokens)), torch.tensor(tokens)]]


async def sample(client: VLLMClient, rid: str, lora: str | None = None) -> GenerateResult:
    return await client.generate(GenerateRequest(rid, PROMPT, SamplingParams(max_tokens=12, temperature=1.0),
                                                 lora=lora))


async def greedy(client: VLLMClient, rid: str) -> GenerateResult:
    return await client.generate(GenerateRequest(rid, PROMPT, SamplingParams(max_tokens=12, temperature=0.0)))


def close(a: list[float], b: list[float]) -> bool:
    return bool(np.allclose(a, b, atol=2e-3))



async def _until_decoding(client: VLLMClient, before: float) -> None:
    """Wait until the engine has generated 8 tokens past ``before`` (a request is decoding)."""
    import asyncio

    while True:
        if (await client.metrics()).generation_tokens >= before + 8:
            return
        await asyncio.sleep(0.05)


async def test_direct_transfer_serves_exactly_the_new_weights_then_restores(client: VLLMClient) -> None:
    base = base_state()
    before = await greedy(client, "d0")
    pub = DirectPublisher([client], ServedWeights.from_checkpoint(ensure_model("tiny")), plan="pause",
                          version=client.policy_version)
    try:
        new = perturbed(base)
        rec = await pub.publish(WeightUpdate(tensors=new), version=client.policy_version + 1)
        r = await sample(client, "d1")
        assert set(r.token_versions) == {rec.version} and rec.serving == {client.base_url: rec.version}
        assert close(r.logprobs, reference_logprobs(new, r.token_ids))
        assert not close(r.logprobs, reference_logprobs(base, r.token_ids))
        print("direct full:", rec.to_dict())
        # compact: one layer's MLP changes, only it (gate/up fused, down) travels
        newer = perturbed(new, only="layers.2.mlp", seed=2)
        rec2 = await pub.publish(WeightUpdate(tensors=newer), version=rec.version + 1)
        assert rec2.tensors == 3, rec2.to_dict()
        r2 = await sample(client, "d2")
        assert close(r2.logprobs, reference_logprobs(newer, r2.token_ids))
        print("direct compact:", rec2.to_dict())
        rec3 = await pub.publish(WeightUpdate(tensors=base), version=rec2.version + 1)
        back = await greedy(client, "d3")
        assert back.token_ids == before.token_ids and close(back.logprobs, before.logprobs)
        assert set(back.token_versions) == {rec3.version}
        # mismatched shapes: refused, the engine keeps serving rec3's version and weights
        bad = dict(base)
        bad["model.layers.0.mlp.down_proj.weight"] = torch.zeros(3, 3)
        with pytest.raises(WeightMismatchError) as info:
            await pub.publish(WeightUpdate(tensors=bad), version=rec3.version + 1)
        assert info.value.serving == {client.base_url: rec3.version}
        assert await client.engine_version() == rec3.version
        still = await greedy(client, "d4")
        assert still.token_ids == before.token_ids
    finally:
        await pub.aclose()


async def test_checkpoint_hot_load_serves_exactly_the_new_weights(client: VLLMClient, tmp_path: Path) -> None:
    base = base_state()
    before = await greedy(client, "c0")
    pub = CheckpointPublisher([client], ensure_model("tiny"), root=tmp_path / "ckpts",
                              version=client.policy_version)
    new = perturbed(base, seed=5)
    rec = await pub.publish(WeightUpdate(tensors=new), version=client.policy_version + 1)
    assert (tmp_path / "ckpts" / f"v{rec.version}" / "model.safetensors").is_file()
    r = await sample(client, "c1")
    assert set(r.token_versions) == {rec.version}
    assert close(r.logprobs, reference_logprobs(new, r.token_ids))
    print("checkpoint:", rec.to_dict())
    bad = tmp_path / "bad"
    bad.mkdir()
    from safetensors.torch import save_file

    save_file({"model.embed_tokens.weight": torch.zeros(7, 7)}, str(bad / "model.safetensors"))
    with pytest.raises(WeightMismatchError):
        await pub.publish(WeightUpdate(path=str(bad)), version=rec.version + 1)
    assert await client.engine_version() == rec.version
    await pub.publish(WeightUpdate(path=str(ensure_model("tiny"))), version=rec.version + 2)
    back = await greedy(client, "c2")
    assert back.token_ids == before.token_ids


async def test_lora_publication_serves_the_adapter(client: VLLMClient, tmp_path: Path) -> None:
    base = base_state()
    adapter = create_tiny_lora(ensure_model("tiny"), tmp_path / "lora-1", rank=8, seed=3)
    pub = LoraPublisher([client], max_rank=8, version=client.policy_version, prefix="pub")
    rec = await pub.publish(WeightUpdate(path=str(adapter), lora=True), version=client.policy_version + 1)
    assert pub.adapter == f"pub-v{rec.version}"
    r = await sample(client, "l1", lora=pub.adapter)
    assert set(r.token_versions) == {rec.version}
    assert close(r.logprobs, reference_logprobs(base, r.token_ids, adapter))
    print("lora:", rec.to_dict())
    plain = await sample(client, "l2")  # base weights stay available without the adapter
    assert close(plain.logprobs, reference_logprobs(base, plain.token_ids))


async def test_lora_abort_plan_ends_the_old_adapters_requests_without_pausing(
    client: VLLMClient, tmp_path: Path
) -> None:
    """Plan ``abort`` of the lora pattern, engine never paused: the request running on the
    previous weights comes back aborted with only the old version's tokens; the new adapter's
    requests carry the new version."""
    import asyncio

    adapter = create_tiny_lora(ensure_model("tiny"), tmp_path / "lora-abort", rank=8, seed=4)
    v0 = client.policy_version
    pub = LoraPublisher([client], max_rank=8, version=v0, prefix="abort", plan="abort")
    assert pub.fleet.abort_only
    req = GenerateRequest("old-adapter", [11, 12, 13], SamplingParams(max_tokens=1500, min_tokens=1500))
    before = (await client.metrics()).generation_tokens
    task = asyncio.create_task(client.generate(req))
    await _until_decoding(client, before)
    rec = await pub.publish(WeightUpdate(path=str(adapter), lora=True), version=v0 + 1)
    r = await task
    assert r.finish_reason == "abort" and 8 <= len(r.token_ids) < 1500
    assert set(r.token_versions) == {v0}
    assert "pause_s" in rec.steps_s and "resume_s" in rec.steps_s and not await client.is_paused()
    after = await sample(client, "new-adapter", lora=pub.adapter)
    assert set(after.token_versions) == {rec.version} == {await client.engine_version()}
    print("lora abort:", rec.to_dict()["steps_s"], rec.apply_pause_s)


async def test_a_request_spanning_a_pause_plan_publication_carries_both_versions(client: VLLMClient) -> None:
    """Plan ``pause``: the request is frozen, the weights swapped, its KV recomputed; the
    engine tags its tokens before the swap with the old version and after with the new."""
    import asyncio

    base = base_state()
    v0 = client.policy_version
    pub = DirectPublisher([client], ServedWeights.from_checkpoint(ensure_model("tiny")), plan="pause",
                          version=v0)
    try:
        req = GenerateRequest("span", [11, 12, 13], SamplingParams(max_tokens=300, min_tokens=300))
        before = (await client.metrics()).generation_tokens
        task = asyncio.create_task(client.generate(req))
        await _until_decoding(client, before)
        assert not task.done()
        rec = await pub.publish(WeightUpdate(tensors=perturbed(base, seed=9)), version=v0 + 1)
        r = await task
        assert r.finish_reason == "length" and len(r.token_versions) == 300
        assert r.token_versions[0] == v0 and r.token_versions[-1] == rec.version
        switch = r.token_versions.index(rec.version)
        assert set(r.token_versions[:switch]) == {v0} and set(r.token_versions[switch:]) == {rec.version}
        print("span: switch at token", switch, rec.to_dict()["steps_s"])
        await pub.publish(WeightUpdate(tensors=base), version=rec.version + 1)
    finally:
        await pub.aclose()
