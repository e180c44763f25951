"""Integration: the gateway on real vLLM serving SmolLM2-135M-Instruct (one server), spoken to
by the official ``openai`` client over real HTTP.

- every token id, log-prob and version a gateway request records is exactly what the engine
  returned for it (a pass-through client keeps the engine's answers), and what the response
  says (``return_token_ids``, ``logprobs``);
- a resent history reuses the held ids exactly (the next prompt starts with the previous
  prompt + the engine's ids), so nothing is re-tokenised;
- the engine's own prefill log-probs of the recorded sequence agree with the recorded ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from recording_client import Recording

from rollbank.chat.template import ChatTemplate
from rollbank.clock import MonotonicClock
from rollbank.gateway.gateway import Gateway
from rollbank.gateway.serve import running
from rollbank.gateway.tokens import ChatDecode
from rollbank.inference.config import ServerConfig
from rollbank.inference.models import ensure_model, load_tokenizer
from rollbank.inference.server import ManagedServers
from rollbank.routing.factory import make_router

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]
MODEL = "smollm2-135m-instruct"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ManagedServers]:
    cfg = ServerConfig(model=MODEL, dtype="float32", compile="eager", kv_cache_gib=1,
                       max_model_len=4096, run_dir=tmp_path_factory.mktemp("vllm-gateway"))
    async with ManagedServers(cfg) as ms:
        yield ms


async def test_gateway_records_exactly_what_the_engine_sampled(servers: ManagedServers) -> None:
    rec_client = Recording(servers.clients[0])
    tok = load_tokenizer(ensure_model(MODEL))
    clock = MonotonicClock()
    gw = Gateway({rec_client.base_url: rec_client},
                 make_router("cache_aware", [rec_client.base_url], clock), ChatDecode(tok),
                 ChatTemplate.for_model(MODEL), model=MODEL, clock=clock,
                 eos_token_id=tok.eos_token_id)
    async with running(gw):
        h = gw.open_session("g0/s0/r0", "g0")
        c = AsyncOpenAI(base_url=h.base_url, api_key=h.api_key, max_retries=0)
        msgs: list[Any] = [{"role": "system", "content": "You are a helpful shell assistant."},
                           {"role": "user", "content": "How do I list files in /app?"}]
        responses = []
        for turn in range(3):
            r = await c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24,
                                                temperature=1.0, logprobs=True,
                                                extra_body={"return_token_ids": True})
            responses.append(r)
            msgs += [r.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": f"Thanks. And step {turn + 2}?"}]
        await c.close()
        rec = await gw.close_session(h)
    assert len(rec.requests) == len(rec_client.results) == 3
    for req, engine, resp in zip(rec.requests, rec_client.results, responses, strict=True):
        assert req.output_token_ids == engine.token_ids and len(engine.token_ids) > 0
        assert req.logprobs == engine.logprobs
        assert req.token_versions == engine.token_versions
        extra: Any = resp.choices[0].model_extra
        assert extra["token_ids"] == engine.token_ids
        lp = resp.choices[0].logprobs
        assert lp is not None and lp.content is not None
        assert [t.logprob for t in lp.content] == engine.logprobs
    for prev, nxt in zip(rec.requests, rec.requests[1:], strict=False):
        held = prev.prompt_token_ids + prev.output_token_ids
        assert nxt.prompt_token_ids[:len(held)] == held and nxt.reused_prompt_tokens == len(held)
    assert [r.segment for r in rec.requests] == [0, 0, 0]
    # the engine's prefill log-probs of the whole recorded sequence, at the sampled positions
    last = rec.requests[-1]
    seq = last.prompt_token_ids + last.output_token_ids
    scored = await servers.clients[0].prompt_logprobs(seq, request_id="gw-rescore")
    mask = rec.tokens["loss_mask"]
    assert rec.tokens["token_ids"] == seq and len(mask) == len(seq)
    worst = max(abs(scored[i] - rec.tokens["logprobs"][i]) for i in range(len(seq)) if mask[i])
    assert worst < 1e-2, worst
