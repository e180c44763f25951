"""Per-request timings of an evaluation, and the engine's time-to-first-token histogram.

:class:`TimingClient` wraps any :class:`~rollbank.inference.protocol.InferenceClient` and
records, for every generation, the client-side request time (send to full answer, on the
injected clock), the tokens generated and the server-reported time to first token when the
server reports one (``Timings.first_token_s``: the fake servers, vLLM completions with
per-request metrics). vLLM's scale-out endpoint reports no per-request timings and answers
non-streamed, so for it the percentiles come from the requests' own client-side times
(:func:`rollbank.evaluation.scoring.ttft_summary` says which); the engine's Prometheus
histogram ``vllm:time_to_first_token_seconds`` (arrival to first token, queueing included),
scraped before and after the run (:func:`ttft_buckets`, :func:`bucket_delta`), is reported
beside them, never as them: its quantiles are bucket edges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rollbank.clock import Clock, MonotonicClock
from rollbank.inference.protocol import (
    AdmissionGate,
    GenerateRequest,
    GenerateResult,
    InferenceClient,
    PauseMode,
    ServerMetrics,
)

TTFT_METRIC = "vllm:time_to_first_token_seconds"


@dataclass(frozen=True)
class RequestTiming:
    request_id: str
    server: str
    total_s: float  # client side: request sent (admission passed) -> whole answer received
    gen_tokens: int
    prompt_tokens: int
    first_token_s: float | None  # server-reported time to first token, when reported
    decode_s: float | None = None  # server-reported decode interval, when reported

    @property
    def tokens_per_s(self) -> float | None:
        """Generated tokens per second of client-side request time (prefill included)."""
        return self.gen_tokens / self.total_s if self.total_s > 0 and self.gen_tokens else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TimingClient:
    """An :class:`InferenceClient` that records a :class:`RequestTiming` per generation."""

    def __init__(self, inner: InferenceClient, *, clock: Clock | None = None) -> None:
        self.inner = inner
        self.clock: Clock = clock or MonotonicClock()
        self.timings: list[RequestTiming] = []

    @property
    def base_url(self) -> str:
        return self.inner.base_url

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @property
    def admission(self) -> AdmissionGate:
        return self.inner.admission

    def set_admission(self, gate: AdmissionGate) -> None:
        self.inner.set_admission(gate)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        await self.inner.admission.wait_open()  # time the request, not a closed gate
        t0 = self.clock.now()
        result = await self.inner.generate(request)
        self.timings.append(RequestTiming(
            request.request_id, result.server, self.clock.now() - t0, len(result.token_ids),
            result.prompt_tokens, result.timings.first_token_s, result.timings.decode_s))
        return result

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None:
        await self.inner.pause(mode, clear_cache=clear_cache)

    async def resume(self) -> None:
        await self.inner.resume()

    async def reset_prefix_cache(self) -> None:
        await self.inner.reset_prefix_cache()

    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        await self.inner.reload_weights(weights_path, version=version)

    async def load_lora(self, name: str, path: str) -> None:
        await self.inner.load_lora(name, path)

    async def unload_lora(self, name: str) -> None:
        await self.inner.unload_lora(name)

    async def health(self) -> bool:
        return await self.inner.health()

    async def metrics(self) -> ServerMetrics:
        return await self.inner.metrics()

    async def aclose(self) -> None:
        await self.inner.aclose()


def ttft_buckets(prometheus_text: str) -> dict[float, float]:
    """``upper bound -> cumulative count`` of the engine's TTFT histogram (summed over label
    sets other than ``le``); empty when the server exposes none."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[float, float] = {}
    for family in text_string_to_metric_families(prometheus_text):
        for s in family.samples:
            if s.name == TTFT_METRIC + "_bucket" and "le" in s.labels:
                le = float(s.labels["le"])
                out[le] = out.get(le, 0.0) + float(s.value)
    return out


def bucket_delta(before: Mapping[float, float], after: Mapping[float, float]
                 ) -> list[tuple[float, float]]:
    """The cumulative histogram of what happened between two scrapes."""
    return sorted((le, after[le] - before.get(le, 0.0)) for le in after)


def merge_buckets(histograms: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Several servers' cumulative histograms (same bounds) added up."""
    out: dict[float, float] = {}
    for h in histograms:
        for le, c in h:
            out[le] = out.get(le, 0.0) + c
    return sorted(out.items())


async def scrape_text(base_url: str) -> str | None:
    """``GET /metrics`` of a vLLM server; None when it does not answer with metrics."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=10.0) as http:
            resp = await http.get(base_url.rstrip("/") + "/metrics")
    except httpx.HTTPError:
        return None
    return resp.text if resp.status_code == 200 else None
