"""accelsim benchmark engine: response bodies parse with rollbank's own vLLM wire parsers."""

from __future__ import annotations

from rollbank.inference import vllm_wire
from rollbank.inference.protocol import GenerateRequest, SamplingParams
from rollbank_bench.accelsim.core import Counters, SimRequest
from rollbank_bench.accelsim.profile import load_profile, with_overrides
from rollbank_bench.accelsim.tokens import TokenSource
from rollbank_bench.accelsim.wire import completion_body, generate_body, prometheus_text


def finished() -> SimRequest:
    src = TokenSource(seed=0, namespace="n", prompt=[1, 2], vocab_size=10, temperature=0, request_id="r")
    r = SimRequest(engine_id="generate-tokens-r", prompt=[1, 2, 3, 4], max_tokens=3, tokens=src,
                   namespace="base", cached=2, output=[5, 6, 7], logprobs=[-0.1, -0.2, -0.3],
                   versions=["default", "2", "2"], arrival=1.0, scheduled_at=1.5,
                   first_token_at=2.0, finished_at=3.0, finish_reason="length")
    return r


def test_generate_body_round_trips_through_the_client_parser() -> None:
    req = GenerateRequest("r", [1, 2, 3, 4], SamplingParams(max_tokens=3))
    res = vllm_wire.parse_scale_out(req, generate_body(finished(), "r", "m", True), server="s",
                                    current_version=0, total_s=2.0)
    assert res.token_ids == [5, 6, 7] and res.logprobs == [-0.1, -0.2, -0.3]
    assert res.token_versions == [0, 2, 2] and res.cached_prompt_tokens == 2
    assert res.timings.queue_s == 0.5 and res.timings.first_token_s == 1.0 and res.timings.decode_s == 1.0


def test_completion_body_round_trips() -> None:
    req = GenerateRequest("r", [1, 2, 3, 4], SamplingParams(max_tokens=3))
    res = vllm_wire.parse_completion(req, completion_body(finished(), "m", True), server="s",
                                     version=4, total_s=2.0)
    assert res.token_ids == [5, 6, 7] and res.prompt_tokens == 4 and res.cached_prompt_tokens == 2


def test_metrics_use_vllm_names() -> None:
    text = prometheus_text(Counters(prefix_cache_queries=10, prefix_cache_hits=4, prompt_tokens=10,
                                    generation_tokens=3), running=2, waiting=1, model="m")
    m = vllm_wire.parse_prometheus(text)
    assert m["vllm:prefix_cache_queries_total"] == 10 and m["vllm:prefix_cache_hits_total"] == 4
    assert m["vllm:num_requests_running"] == 2 and m["vllm:num_requests_waiting"] == 1


def test_vocab_override_drops_unreachable_eos() -> None:
    p = with_overrides(load_profile("h100-llama3.1-8b"), vocab_size=2048)
    assert p.vocab_size == 2048 and p.eos_token_id is None
    assert p.step_base_s == load_profile("h100-llama3.1-8b").step_base_s
