"""The inference seam: token ids in, token ids + behaviour log-probs out.

:class:`InferenceClient` is implemented by the vLLM client (real), the SGLang client (tested
against a recorded contract only) and :mod:`rollbank.inference.fake` (unit tests). Every
generated token comes back with the log-prob of the distribution actually sampled from and the
weight version that produced it, as the engine reports it (``token_versions``).

Every client waits on its :class:`AdmissionGate` before sending a generation, so nothing is
sent while a publication (:mod:`rollbank.inference.publishing`) has admission closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
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


class AdmissionGate:
    """Open/closed gate every client awaits before sending a generation (closed during updates)."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def wait_open(self) -> None:
        await self._open.wait()


@dataclass(frozen=True)
class GenerateResult:
    request_id: str
    server: str  # base URL of the server that answered
    token_ids: list[int]
    logprobs: list[float]  # one per generated token (behaviour log-prob)
    finish_reason: FinishReason
    text: str
    prompt_tokens: int
    policy_version: int  # the engine's version when it answered (last token's version)
    timings: Timings
    cached_prompt_tokens: int | None = None  # prefix-cache hit, when the server reports it
    # One weight version per generated token, as the engine reports it (a request that
    # straddles a weight update carries both versions). Empty only when ``token_ids`` is.
    token_versions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.token_versions) != len(self.token_ids):
            raise ValueError(
                f"{len(self.token_versions)} token versions for {len(self.token_ids)} tokens"
            )


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

    @property
    def admission(self) -> AdmissionGate:
        """The gate :meth:`generate` waits on before sending."""
        ...

    def set_admission(self, gate: AdmissionGate) -> None:
        """Share ``gate`` (a publisher's) as this client's admission gate."""
        ...

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...

    async def abort(self, request_id: str) -> None: ...

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None: ...

    async def resume(self) -> None: ...

    async def reset_prefix_cache(self) -> None: ...

    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        """Hot-load a checkpoint and name it ``version`` on the engine (which then tags the
        tokens it generates with it)."""
        ...

    async def load_lora(self, name: str, path: str) -> None: ...

    async def unload_lora(self, name: str) -> None: ...

    async def health(self) -> bool: ...

    async def metrics(self) -> ServerMetrics: ...

    async def aclose(self) -> None: ...


class ServerFeed(Protocol):
    """Inference servers that become ready one by one (managed servers still starting).

    The collection driver follows it: every change is an input to the scheduler's inference
    capacity, and the router learns the new targets (``Router.on_server_ready``)."""

    @property
    def ready(self) -> tuple[str, ...]:
        """URLs of the servers serving now."""
        ...

    def watch(self) -> AsyncIterator[tuple[str, ...]]:
        """The ready servers now, then each time one joins (ends when every start settled)."""
        ...

    async def settled(self) -> tuple[str, ...]:
        """Wait until every server serves or failed to start; the ready ones."""
        ...
