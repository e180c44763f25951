"""Integration: the colocated pattern with a real in-process vLLM engine (tiny model).

The engine runs in this test process; publications hand it the tensors by reference. Its
sampled-token log-probs must equal an fp32 transformers forward of the published weights,
and restoring the base weights restores the base greedy outputs. Publications prepare the
update on a shadow of the model first (staged reload): preparing alone changes no output.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rollbank.errors import WeightMismatchError
from rollbank.inference.models import ensure_model
from rollbank.inference.publishing import (
    ColocatedEngine,
    ColocatedPublisher,
    ServedWeights,
    WeightUpdate,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
vllm = pytest.importorskip("vllm")

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

PROMPT = list(range(10, 150))


@pytest.fixture(scope="module")
def engine() -> Iterator[ColocatedEngine]:
    eng = ColocatedEngine(ensure_model("tiny"), dtype="float32", max_model_len=512, kv_cache_gib=1)
    yield eng
    del eng


def run(engine: ColocatedEngine, temperature: float) -> tuple[list[int], list[float]]:
    params = vllm.SamplingParams(max_tokens=12, temperature=temperature, logprobs=0)
    (out,) = engine.generate([PROMPT], params)
    comp = out.outputs[0]
    return list(comp.token_ids), [float(d[t].logprob) for t, d in zip(comp.token_ids, comp.logprobs, strict=True)]


def reference(state: dict[str, Any], tokens: list[int]) -> list[float]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ensure_model("tiny")), dtype=torch.float32)
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1 : -1]
    lp = torch.log_softmax(logits, dim=-1)
    return [float(x) for x in lp[torch.arange(len(tokens)), torch.tensor(tokens)]]


def test_colocated_publication_serves_exactly_the_new_weights(engine: ColocatedEngine) -> None:
    served = ServedWeights.from_checkpoint(ensure_model("tiny"))
    base = dict(served.tensors)
    pub = ColocatedPublisher(engine, served, plan="pause")
    before_ids, before_lp = run(engine, 0.0)
    g = torch.Generator().manual_seed(11)
    new = {n: t + 0.04 * torch.randn(t.shape, generator=g) if "norm" not in n else t for n, t in base.items()}
    # an update prepared beside the serving model changes nothing until it is swapped in
    engine.stage_weights(list(new.items()))
    staged_ids, staged_lp = run(engine, 0.0)
    assert staged_ids == before_ids and np.allclose(staged_lp, before_lp, atol=1e-5)
    engine.discard_staged()
    rec = asyncio.run(pub.publish(WeightUpdate(tensors=new), version=1))
    assert engine.engine_version() == 1 and rec.serving == {"colocated": 1}
    ids, lp = run(engine, 1.0)
    assert np.allclose(lp, reference(new, ids), atol=2e-3)
    assert not np.allclose(lp, reference(base, ids), atol=2e-3)
    print("colocated:", rec.to_dict())
    bad = dict(base)
    bad["lm_head.weight"] = torch.zeros(3, 3)
    with pytest.raises(WeightMismatchError):
        asyncio.run(pub.publish(WeightUpdate(tensors=bad), version=2))
    assert engine.engine_version() == 1
    asyncio.run(pub.publish(WeightUpdate(tensors=base), version=3))
    back_ids, back_lp = run(engine, 0.0)
    assert back_ids == before_ids and np.allclose(back_lp, before_lp, atol=1e-5)
