"""The in-memory fake inference server (a simulated engine) for unit tests and simulations.

Owns: :class:`FakeInferenceServer`. Imported through :mod:`rollbank.inference.fake`, which
also gives its client (``fake_client.py``) and tokenizer (``fake_tokenizer.py``).

What the fake simulates, and its invariants
- Generation is deterministic: the same (server seed, weights, LoRA, prompt, temperature,
  request id when temperature > 0) gives the same tokens and log-probs. Greedy requests
  (temperature 0) do not depend on the request id; sampled ones do, so GRPO siblings differ.
  A ``responder`` callback can script the completion text instead (harness/runner tests).
- Weights are identified by the path last passed to ``reload_weights``; reloading a path
  restores exactly the outputs that path gave before. ``policy_version`` is what the last
  reload announced. Like vLLM's scale-out engine, every generated token is tagged with the
  version held when that token was generated (``token_versions``): a request frozen by
  pause("keep") across a reload carries both versions; ``policy_version`` of a result is the
  version held when it finished.
- Prefix cache: full blocks of ``block_size`` tokens keyed by a hash chain (so a block only
  hits when everything before it matches), LRU-evicted past ``cache_capacity_blocks``.
  Prompt and generated blocks are inserted after a request, as vLLM does. The cache is
  namespaced by weights and LoRA and cleared on reload/reset. ``cached_prompt_tokens`` and
  :class:`ServerMetrics` counters report it.
- Latency is optional and real (``asyncio.sleep``): ``prefill_s_per_token`` for every uncached
  prompt token, ``decode_s_per_token`` per generated token. With both 0 the fake still yields
  to the event loop once per token, so aborts and pauses interleave.
- At most ``max_running`` requests run at once; the rest wait (``waiting`` in metrics).
- pause("abort") finishes in-flight requests with ``finish_reason="abort"`` and partial
  output; pause("wait") lets them drain; pause("keep") freezes them until resume. While
  paused, new requests wait for resume.
- ``kill()`` simulates an engine death: in-flight and later requests raise
  :class:`EngineDeadError` and ``health()`` is False until ``restart()``.
"""

from __future__ import annotations

import asyncio
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rollbank.clock import Clock, MonotonicClock
from rollbank.errors import (
    BadRequestError,
    EngineDeadError,
    ServerOverloadedError,
)
from rollbank.inference.fake_tokenizer import FakeTokenizer
from rollbank.inference.prefix_cache import BlockPrefixCache, digest
from rollbank.inference.protocol import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    ServerMetrics,
    Timings,
)

__all__ = ["FakeInferenceServer", "Responder"]

Responder = Callable[[GenerateRequest], str | None]


@dataclass
class _InFlight:
    request_id: str
    aborted: bool = False
    dead: bool = False


@dataclass
class _Counters:
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests: int = 0


@dataclass
class FakeInferenceServer:
    """A simulated inference engine (see the module docstring for what it models)."""

    base_url: str = "fake://server-0"
    seed: int = 0
    block_size: int = 16
    cache_capacity_blocks: int = 4096
    max_model_len: int = 4096
    max_running: int = 64
    max_waiting: int | None = None  # None: unbounded queue; else 503 past this many waiting
    prefill_s_per_token: float = 0.0
    decode_s_per_token: float = 0.0
    eos_probability: float = 0.0  # chance per generated token of emitting EOS (sampled mode)
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    responder: Responder | None = None
    clock: Clock = field(default_factory=MonotonicClock)

    policy_version: int = field(default=0, init=False)
    weights_path: str = field(default="initial", init=False)
    loras: dict[str, str] = field(default_factory=dict, init=False)
    counters: _Counters = field(default_factory=_Counters, init=False)
    cache_resets: int = field(default=0, init=False)
    requests_seen: list[GenerateRequest] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._cache = BlockPrefixCache(self.block_size, self.cache_capacity_blocks)
        self._inflight: dict[str, _InFlight] = {}
        self._running = 0
        self._waiting = 0
        self._slot_free = asyncio.Condition()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._frozen = asyncio.Event()  # set = not frozen (pause "keep" clears it)
        self._frozen.set()
        self._paused = False
        self._dead = False

    # ------------------------------------------------------------------ control plane
    @property
    def is_paused(self) -> bool:
        return self._paused

    @property
    def is_dead(self) -> bool:
        return self._dead

    @property
    def running(self) -> int:
        return self._running

    @property
    def cached_blocks(self) -> int:
        return len(self._cache)

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None:
        self._paused = True
        self._resumed.clear()
        if mode == "abort":
            for f in self._inflight.values():
                f.aborted = True
        elif mode == "keep":
            self._frozen.clear()
        else:  # wait: drain in-flight requests
            async with self._slot_free:
                await self._slot_free.wait_for(lambda: self._running == 0)
        if clear_cache:
            self.reset_prefix_cache()

    def resume(self) -> None:
        self._paused = False
        self._frozen.set()
        self._resumed.set()

    def reset_prefix_cache(self) -> None:
        self._cache.clear()
        self.cache_resets += 1

    def reload_weights(self, weights_path: str, *, version: int) -> None:
        self.weights_path = weights_path
        self.policy_version = version
        self.reset_prefix_cache()

    def load_lora(self, name: str, path: str) -> None:
        if name in self.loras:
            raise BadRequestError(f"LoRA {name!r} is already loaded", server=self.base_url)
        self.loras[name] = path

    def unload_lora(self, name: str) -> None:
        if self.loras.pop(name, None) is None:
            raise BadRequestError(f"LoRA {name!r} is not loaded", server=self.base_url)

    def abort(self, request_id: str) -> None:
        f = self._inflight.get(request_id)
        if f is not None:
            f.aborted = True

    def kill(self) -> None:
        """Simulate an engine death: every in-flight and later request fails."""
        self._dead = True
        for f in self._inflight.values():
            f.dead = True
        self._frozen.set()
        self._resumed.set()

    def restart(self) -> None:
        """Bring a killed engine back: empty cache, same weights and version, unpaused."""
        self._dead = False
        self._paused = False
        self._frozen.set()
        self._resumed.set()
        self.loras.clear()
        self._cache.clear()
        self.counters = _Counters()

    def metrics(self) -> ServerMetrics:
        c = self.counters
        return ServerMetrics(
            running=self._running,
            waiting=self._waiting,
            prefix_cache_queries=c.prefix_cache_queries,
            prefix_cache_hits=c.prefix_cache_hits,
            prompt_tokens=c.prompt_tokens,
            generation_tokens=c.generation_tokens,
        )

    async def wait_until(self, predicate: Callable[[FakeInferenceServer], bool]) -> None:
        """Block until ``predicate(self)`` holds; re-checked whenever a request starts,
        finishes or generates a token (tests use it instead of polling)."""
        async with self._slot_free:
            await self._slot_free.wait_for(lambda: predicate(self))

    # ------------------------------------------------------------------ generation
    def _sample(self, req: GenerateRequest, context: Sequence[int], step: int) -> tuple[int, float]:
        greedy = req.sampling.temperature <= 0.0
        key = digest(
            self.seed,
            self.weights_path,
            req.lora,
            tuple(req.prompt_token_ids[-64:]),
            len(req.prompt_token_ids),
            step,
            None if greedy else req.request_id,
            None if greedy else req.sampling.temperature,
        )
        a, b = struct.unpack("<QQ", key)
        u = (b % 1_000_000) / 1_000_000.0
        if not greedy and self.eos_probability > 0 and u < self.eos_probability:
            token = self.tokenizer.EOS
        else:
            token = 32 + a % 95  # printable ASCII keeps decoded text readable
        logprob = 0.0 if greedy else math.log(max(1e-6, 0.05 + 0.9 * ((a >> 8) % 1000) / 1000.0))
        return token, logprob

    def _scripted(self, req: GenerateRequest) -> list[int] | None:
        if self.responder is None:
            return None
        text = self.responder(req)
        return None if text is None else self.tokenizer.encode(text)

    async def _acquire_slot(self, request_id: str) -> None:
        busy = not self._resumed.is_set() or self._running >= self.max_running
        if busy and self.max_waiting is not None and self._waiting >= self.max_waiting:
            raise ServerOverloadedError(
                "too many waiting requests", server=self.base_url, request_id=request_id
            )
        self._waiting += 1
        try:
            while True:
                await self._resumed.wait()
                if self._dead:
                    raise EngineDeadError("engine is dead", server=self.base_url, request_id=request_id)
                async with self._slot_free:
                    if self._resumed.is_set() and self._running < self.max_running:
                        self._running += 1
                        self._slot_free.notify_all()
                        return
                    await self._slot_free.wait_for(
                        lambda: self._running < self.max_running or not self._resumed.is_set()
                    )
        finally:
            self._waiting -= 1

    async def _release_slot(self) -> None:
        async with self._slot_free:
            self._running -= 1
            self._slot_free.notify_all()

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        if self._dead:
            raise EngineDeadError("engine is dead", server=self.base_url, request_id=req.request_id)
        prompt = list(req.prompt_token_ids)
        if not prompt:
            raise BadRequestError("prompt is empty", server=self.base_url, request_id=req.request_id)
        if len(prompt) > self.max_model_len:  # as vLLM: a too-long prompt is an error...
            raise BadRequestError(
                f"prompt ({len(prompt)} tokens) exceeds max_model_len ({self.max_model_len})",
                server=self.base_url,
                request_id=req.request_id,
            )
        if req.lora is not None and req.lora not in self.loras:
            raise BadRequestError(f"LoRA {req.lora!r} is not loaded", server=self.base_url)
        if req.request_id in self._inflight:
            raise BadRequestError(f"duplicate request id {req.request_id!r}", server=self.base_url)
        t0 = self.clock.now()
        flight = _InFlight(req.request_id)
        self._inflight[req.request_id] = flight
        self.requests_seen.append(req)
        try:
            await self._acquire_slot(req.request_id)
            try:
                return await self._run(req, prompt, flight, t0)
            finally:
                await self._release_slot()
        finally:
            del self._inflight[req.request_id]

    async def _run(
        self, req: GenerateRequest, prompt: list[int], flight: _InFlight, t0: float
    ) -> GenerateResult:
        sp = req.sampling
        t_start = self.clock.now()
        cached = self._cache.lookup(prompt, (self.weights_path, req.lora))
        self.counters.prefix_cache_queries += len(prompt)
        self.counters.prefix_cache_hits += cached
        self.counters.prompt_tokens += len(prompt)
        self.counters.requests += 1
        await asyncio.sleep((len(prompt) - cached) * self.prefill_s_per_token)
        t_first: float | None = None
        scripted = self._scripted(req)
        out: list[int] = []
        lps: list[float] = []
        versions: list[int] = []
        finish: FinishReason = "length"
        stops = set(sp.stop_token_ids)
        eos = self.tokenizer.eos_token_id
        # ...but max_tokens is clamped to the context left (finish_reason "length").
        for step in range(min(sp.max_tokens, self.max_model_len - len(prompt))):
            await asyncio.sleep(self.decode_s_per_token)
            await self._frozen.wait()
            if flight.dead:
                raise EngineDeadError("engine died", server=self.base_url, request_id=req.request_id)
            if flight.aborted:
                finish = "abort"
                break
            if scripted is not None:
                if step >= len(scripted):
                    token, lp = (eos if eos is not None else 0), -0.01
                else:
                    token, lp = scripted[step], -0.01 - 0.001 * (step % 7)
            else:
                token, lp = self._sample(req, out, step)
            if step < sp.min_tokens and (token in stops or token == eos):
                token = 32  # like vLLM's logit mask: no EOS / stop token before min_tokens
            if t_first is None:
                t_first = self.clock.now()
            out.append(token)
            lps.append(lp)
            versions.append(self.policy_version)
            self.counters.generation_tokens += 1
            async with self._slot_free:
                self._slot_free.notify_all()
            if step + 1 < sp.min_tokens:
                continue  # like vLLM: stop strings are not checked before min_tokens
            if token in stops or token == eos:
                finish = "stop"
                break
            text = self.tokenizer.decode(out)
            hit = next((s for s in sp.stop if s and s in text), None)
            if hit is not None:
                finish = "stop"
                break
        self._cache.insert(prompt + out, (self.weights_path, req.lora))
        text = self.tokenizer.decode(out)
        for s in sp.stop:
            if s and s in text:
                text = text[: text.index(s)]
                break
        t_end = self.clock.now()
        return GenerateResult(
            request_id=req.request_id,
            server=self.base_url,
            token_ids=out,
            logprobs=lps,
            finish_reason=finish,
            text=text,
            prompt_tokens=len(prompt),
            policy_version=self.policy_version,
            token_versions=versions,
            timings=Timings(
                total_s=t_end - t0,
                queue_s=t_start - t0,
                prefill_s=(t_first - t_start) if t_first is not None else None,
                decode_s=(t_end - t_first) if t_first is not None else None,
                first_token_s=(t_first - t0) if t_first is not None else None,
            ),
            cached_prompt_tokens=cached,
        )
