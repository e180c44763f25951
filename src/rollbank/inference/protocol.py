"""The inference seam: token ids in, token ids + behaviour log-probs out.

:class:`InferenceClient` is implemented by the vLLM client (real), the SGLang client (tested
against a recorded contract only) and :mod:`rollbank.inference.fake` (unit tests). Every
generated token comes back with the log-prob of the distribution actually sampled from and the
policy version of the weights that produced it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

FinishReason = Literal["stop", "length", "abort"]
PauseMode = Literal["abort", "wait", "keep"]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = True  # return the sampled token's log-prob (processed: after temperature)
    min_tokens: int = 0  # EOS and stop_token_ids are not honoured before this many tokens


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: Sequence[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    lora: str | None = None  # name of a loaded LoRA adapter, None for the base weights


@dataclass(frozen=True)
class Timings:
    """Seconds. ``None`` where the server does not report the phase."""

    total_s: float
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    first_token_s: float | None = None


@dataclass(frozen=True)
class GenerateResult:
    request_id: str
    server: str  # base URL of the server that answered
    token_ids: list[int]
    logprobs: list[float]  # one per generated token (behaviour log-prob)
    finish_reason: FinishReason
    text: str
    prompt_tokens: int
    policy_version: int  # weight version the server held when it answered
    timings: Timings
    cached_prompt_tokens: int | None = None  # prefix-cache hit, when the server reports it


@dataclass(frozen=True)
class ServerMetrics:
    """A scrape of the server's own metrics (cumulative counters since server start)."""

    running: int
    waiting: int
    prefix_cache_queries: float  # tokens looked up in the prefix cache
    prefix_cache_hits: float  # tokens found
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


class Tokenizer(Protocol):
    """Encodes and decodes with the exact vocabulary of the served model."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None: ...


class InferenceClient(Protocol):
    """One inference server. Methods raise :class:`~rollbank.errors.InferenceError` subtypes."""

    @property
    def base_url(self) -> str: ...

    @property
    def policy_version(self) -> int: ...

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...

    async def abort(self, request_id: str) -> None: ...

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None: ...

    async def resume(self) -> None: ...

    async def reset_prefix_cache(self) -> None: ...

    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        """Hot-load a checkpoint; afterwards tokens are tagged with ``version``."""
        ...

    async def load_lora(self, name: str, path: str) -> None: ...

    async def unload_lora(self, name: str) -> None: ...

    async def health(self) -> bool: ...

    async def metrics(self) -> ServerMetrics: ...

    async def aclose(self) -> None: ...
