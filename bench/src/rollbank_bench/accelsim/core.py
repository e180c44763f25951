"""The accelsim benchmark engine's scheduler: continuous batching in virtual time (pure).

Owns :class:`EngineCore` and :class:`SimRequest`. No I/O and no clock: the asyncio driver
(:mod:`.driver`) asks :meth:`EngineCore.plan` for the next step, sleeps its duration and calls
:meth:`EngineCore.apply` with the time it woke. Unit tests call the same two methods with a
hand-moved time.

One step (as vLLM V1 schedules it)
- Running sequences that finished their prompt decode one token each; each costs 1 of the
  ``max_num_batched_tokens`` budget.
- Sequences still prefilling (chunked prefill) get the next chunk from the remaining budget,
  then waiting requests are admitted FCFS while ``max_num_seqs`` and the KV capacity allow:
  at admission the prefix cache is looked up (vLLM's accounting: queries = prompt tokens,
  hits = cached tokens, never the last prompt token) and only the uncached part is prefilled.
- The step that completes a prompt also samples its first token (TTFT ends there). A prompt
  chunk's full blocks enter the prefix cache when the chunk is scheduled (vLLM V1 registers
  block hashes at allocation), so siblings admitted later, even in the same step, hit them; at
  finish the computed output blocks do too. Finish: a stop id or EOS once ``min_tokens`` are out, or ``max_tokens``, or abort.

Approximations (stated, not hidden): no preemption (admission waits for KV room instead);
blocks held by running sequences shrink the prefix cache's capacity (LRU eviction of cached
blocks), counted as their blocks not in the cache, so a block shared by a running request and
the cache is counted once; admission needs every running sequence's blocks + the new prompt's
to fit; stop *strings* are not honoured (the engine has no tokenizer).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rollbank.inference.prefix_cache import BlockPrefixCache
from rollbank_bench.accelsim.profile import LatencyProfile
from rollbank_bench.accelsim.tokens import TokenSource


@dataclass
class SimRequest:
    """One generation inside the engine (times are the driver's clock, seconds)."""

    engine_id: str
    prompt: list[int]
    max_tokens: int
    tokens: TokenSource
    namespace: str
    min_tokens: int = 0
    stop_ids: frozenset[int] = frozenset()
    arrival: float = 0.0
    cached: int = 0
    computed: int = 0  # prompt tokens whose KV exists (cached + prefilled)
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None

    @property
    def prefilling(self) -> bool:
        return self.computed < len(self.prompt)

    @property
    def context(self) -> int:
        return len(self.prompt) + len(self.output)


@dataclass(frozen=True)
class Step:
    """What one forward pass does: decode these, prefill these chunks; lasts ``duration``."""

    decode: tuple[SimRequest, ...]
    prefill: tuple[tuple[SimRequest, int], ...]
    duration: float


@dataclass
class Counters:
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    busy_s: float = 0.0


class EngineCore:
    """Waiting queue, running batch, prefix cache and counters of one emulated engine."""

    def __init__(self, profile: LatencyProfile) -> None:
        self.profile = profile
        self.cache = BlockPrefixCache(profile.block_size, profile.kv_capacity_blocks)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.counters = Counters()
        self.weight_version = "default"

    # ------------------------------------------------------------------ queue
    def add(self, req: SimRequest, now: float) -> None:
        req.arrival = now
        self.waiting.append(req)

    def abort(self, engine_id: str, now: float) -> SimRequest | None:
        """Finish ``engine_id`` with ``abort`` (partial output kept); None if unknown."""
        for req in list(self.waiting) + self.running:
            if req.engine_id == engine_id:
                self._finish(req, "abort", now)
                return req
        return None

    def abort_all(self, now: float) -> list[SimRequest]:
        reqs = list(self.waiting) + list(self.running)
        for req in reqs:
            self._finish(req, "abort", now)
        return reqs

    def reset_cache(self) -> None:
        self.cache.clear()

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # ------------------------------------------------------------------ capacity
    def _held_blocks(self) -> int:
        """Blocks of running sequences that are not (yet) in the prefix cache."""
        bs = self.profile.block_size
        held = 0
        for r in self.running:
            shared = r.cached if r.prefilling else len(r.prompt) // bs * bs
            held += -(-(r.context - shared) // bs)
        return held

    def _shrink_cache(self) -> None:
        self.cache.capacity_blocks = max(0, self.profile.kv_capacity_blocks - self._held_blocks())
        self.cache.insert([])  # evicts LRU blocks down to the new capacity

    # ------------------------------------------------------------------ stepping
    def plan(self, now: float) -> Step | None:
        """The next step (admitting waiting requests); None when nothing can run."""
        p = self.profile
        budget = p.max_num_batched_tokens
        decode = [r for r in self.running if not r.prefilling][:budget]
        budget -= len(decode)
        prefill: list[tuple[SimRequest, int]] = []
        for r in self.running:
            if r.prefilling and budget > 0:
                chunk = min(len(r.prompt) - r.computed, budget)
                prefill.append((r, chunk))
                self.cache.insert(r.prompt[: r.computed + chunk], r.namespace)
                budget -= chunk
        while self.waiting and budget > 0 and len(self.running) < p.max_num_seqs:
            req = self.waiting[0]
            need = -(-req.context // p.block_size)
            used = sum(-(-r.context // p.block_size) for r in self.running)  # blocks in use
            if self.running and used + need > p.kv_capacity_blocks:
                break  # no preemption: wait for KV room
            self.waiting.popleft()
            req.cached = self.cache.lookup(req.prompt, req.namespace)
            req.computed = req.cached
            req.scheduled_at = now
            self.counters.prefix_cache_queries += len(req.prompt)
            self.counters.prefix_cache_hits += req.cached
            self.counters.prompt_tokens += len(req.prompt)
            self.running.append(req)
            chunk = min(len(req.prompt) - req.computed, budget)  # >= 1: last token never cached
            prefill.append((req, chunk))
            # vLLM V1 registers a block's hash when it is scheduled (allocate_slots), so a
            # request scheduled later, even in this same step, already hits it
            self.cache.insert(req.prompt[: req.computed + chunk], req.namespace)
            budget -= chunk
        if not decode and not prefill:
            return None
        duration = p.step_time(
            prefill_tokens=sum(c for _, c in prefill),
            prefill_seqs=len(prefill),
            decode_seqs=len(decode),
            decode_ctx_tokens=sum(r.context for r in decode),
            prefill_pairs=sum(c * (r.computed + (c + 1) / 2) for r, c in prefill),
        )
        return Step(tuple(decode), tuple(prefill), duration)

    def apply(self, step: Step, now: float) -> list[SimRequest]:
        """Emit the step's tokens at ``now``; return the requests that finished."""
        self.counters.steps += 1
        self.counters.busy_s += step.duration
        done: list[SimRequest] = []
        emit = [r for r in step.decode if r.finish_reason is None]
        for req, chunk in step.prefill:
            if req.finish_reason is not None:
                continue
            req.computed = min(len(req.prompt), req.computed + chunk)
            if not req.prefilling:
                req.first_token_at = now
                emit.append(req)
        for req in emit:
            n = len(req.output)
            tok, lp = req.tokens.token(n, allow=n >= req.min_tokens)
            req.output.append(tok)
            req.logprobs.append(lp)
            req.versions.append(self.weight_version)
            self.counters.generation_tokens += 1
            if n + 1 >= req.min_tokens and tok in req.stop_ids:
                self._finish(req, "stop", now)
                done.append(req)
            elif n + 1 >= req.max_tokens or req.context >= self.profile.max_model_len:
                self._finish(req, "length", now)
                done.append(req)
        self._shrink_cache()
        return done

    def _finish(self, req: SimRequest, reason: str, now: float) -> None:
        req.finish_reason = reason
        req.finished_at = now
        if req in self.running:
            self.running.remove(req)
            if not req.prefilling:
                # the last sampled token has no KV yet: cache the computed tokens only
                self.cache.insert(req.prompt + req.output[:-1], req.namespace)
        elif req in self.waiting:
            self.waiting.remove(req)
