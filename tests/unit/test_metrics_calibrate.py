"""Capacity calibration against fake servers: probes are cache-proof and rates are sane."""

from __future__ import annotations

from rollbank.inference.fake import make_fake_fleet
from rollbank.metrics.calibrate import calibrate


async def test_calibration_probes_every_server_without_cache_help() -> None:
    servers, clients = make_fake_fleet(2, decode_s_per_token=0.0005,
                                       prefill_s_per_token=0.00001)
    cap = await calibrate({c.base_url: c for c in clients}, sandbox_slots=8, vocab_size=258,
                          prefill_tokens=128, decode_tokens=16, concurrency=3,
                          verifier_slots=2)
    assert cap.source == "measured" and cap.sandbox_slots == 8 and cap.verifier_slots == 2
    assert cap.decode_rate_max >= cap.decode_rate_single > 0
    assert cap.prefill_rate_max >= cap.prefill_rate_single > 0
    assert cap.ttft_floor_s >= 0
    # every server took part in the aggregate waves
    assert all(s.counters.requests >= 3 for s in servers)
    # probe prompts are unique random ids: the prefix cache never helped
    assert sum(s.counters.prefix_cache_hits for s in servers) == 0
    # greedy probes (no per-request seed, which kills vLLM CPU 0.32)
    assert all(r.sampling.temperature == 0.0 for s in servers for r in s.requests_seen)
