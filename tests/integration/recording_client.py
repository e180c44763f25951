"""A pass-through vLLM client that keeps every answer the engine gave (the real-vLLM chat and
gateway tests compare recorded trajectories against it)."""

from __future__ import annotations

from typing import Any

from rollbank.inference.protocol import GenerateRequest, GenerateResult
from rollbank.inference.vllm_client import VLLMClient


class Recording:
    """Delegates to ``inner``; ``results`` holds every :class:`GenerateResult` in order."""

    def __init__(self, inner: VLLMClient) -> None:
        self.inner = inner
        self.results: list[GenerateResult] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def base_url(self) -> str:
        return self.inner.base_url

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        result = await self.inner.generate(request)
        self.results.append(result)
        return result
