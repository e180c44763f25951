"""The in-process engine as an :class:`~rollbank.inference.protocol.InferenceClient`.

With ``rollbank train --publisher colocated`` the episodes generate through a
:class:`ColocatedClient` over the :class:`~rollbank.inference.publishing.colocated.ColocatedEngine`
living in the trainer's process, and the :class:`ColocatedPublisher` hands the trainer's tensors
to the same engine by reference (no HTTP, no disk, no serialisation).

One stepping thread owns the engine's progress: it adds the requests :meth:`generate` queued
(the event loop never takes the engine's lock), aborts what was asked, and runs one engine step
at a time under the lock, so a publication (``ColocatedEngine.hold``) slips in between two
steps. Every step's new tokens are tagged with the version of the weights in the engine at that
step (``ColocatedEngine.version``, moved only under the lock), so a request that straddles a
publication carries both versions, split where the swap happened, as a server reports them.

Log-probs are vLLM's processed ones (after temperature), as the managed servers return them.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollbank.errors import BadRequestError, EngineDeadError
from rollbank.inference.engine_output import checked_logprobs
from rollbank.inference.protocol import (
    AdmissionGate,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    SamplingParams,
    ServerMetrics,
    Timings,
)
from rollbank.inference.publishing.colocated import ColocatedEngine

URL = "colocated://0"
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


@dataclass
class _Pending:
    """One request in the engine; its sink runs in the stepping thread (the lock held)."""

    request: GenerateRequest
    engine: ColocatedEngine
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[GenerateResult]
    t0: float
    versions: list[int] = field(default_factory=list)
    last: Any = None
    first_token_s: float | None = None

    def sink(self, out: Any) -> None:
        if isinstance(out, BaseException):
            self._deliver(out)
            return
        if out is None:  # aborted: the partial tokens, finish_reason abort
            self._deliver(self._result("abort"))
            return
        n = len(out.outputs[0].token_ids) if out.outputs else 0
        if n > len(self.versions):
            if self.first_token_s is None:
                self.first_token_s = time.monotonic() - self.t0
            self.versions.extend([self.engine.version] * (n - len(self.versions)))
        self.last = out
        if out.finished:
            try:
                self._deliver(self._result(_FINISH.get(str(out.outputs[0].finish_reason), "stop")))
            except Exception as exc:  # e.g. an unusable log-prob
                self._deliver(exc)

    def _result(self, finish: FinishReason) -> GenerateResult:
        rid = self.request.request_id
        comp = self.last.outputs[0] if self.last is not None and self.last.outputs else None
        ids = [] if comp is None else [int(t) for t in comp.token_ids]
        if comp is not None and comp.logprobs is not None and self.request.sampling.logprobs:
            raw = [d[t].logprob for t, d in zip(ids, comp.logprobs, strict=False)]
            lps = checked_logprobs(raw, server=URL, request_id=rid)
        else:
            lps = [0.0] * len(ids)
        versions = self.versions[: len(ids)]
        cached = getattr(self.last, "num_cached_tokens", None) if self.last is not None else None
        return GenerateResult(
            request_id=rid, server=URL, token_ids=ids, logprobs=lps[: len(ids)],
            finish_reason=finish, text="" if comp is None else str(comp.text),
            prompt_tokens=len(self.request.prompt_token_ids),
            policy_version=versions[-1] if versions else self.engine.version,
            timings=Timings(total_s=time.monotonic() - self.t0, first_token_s=self.first_token_s),
            cached_prompt_tokens=None if cached is None else int(cached), token_versions=versions,
        )  # fmt: skip

    def _deliver(self, value: GenerateResult | BaseException) -> None:
        def settle() -> None:
            if self.future.done():
                return
            if isinstance(value, BaseException):
                self.future.set_exception(value)
            else:
                self.future.set_result(value)

        self.loop.call_soon_threadsafe(settle)


def vllm_sampling(sp: SamplingParams | None) -> Any:
    """rollbank's sampling options as vLLM's (the sampled token's log-prob when asked); None:
    a scoring request (prefill with each prompt token's log-prob, one throw-away token)."""
    from vllm import SamplingParams as VLLMSampling

    if sp is None:
        return VLLMSampling(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    return VLLMSampling(
        max_tokens=sp.max_tokens, temperature=sp.temperature, top_p=sp.top_p,
        stop=list(sp.stop) or None, stop_token_ids=list(sp.stop_token_ids) or None,
        logprobs=0 if sp.logprobs else None, min_tokens=sp.min_tokens,
        skip_special_tokens=False,
    )  # fmt: skip


class ColocatedClient:
    """An :class:`InferenceClient` over an in-process :class:`ColocatedEngine`."""

    def __init__(self, engine: ColocatedEngine, *, idle_wait_s: float = 0.05,
                 sampling: Callable[[SamplingParams | None], Any] = vllm_sampling) -> None:
        self.engine = engine
        self._sampling = sampling  # rollbank's options -> the engine's (a seam for fakes)
        self._gate = AdmissionGate()
        self._pending: dict[str, _Pending] = {}
        self._idle = asyncio.Event()  # no request in flight
        self._idle.set()
        self._aborts: collections.deque[str] = collections.deque()
        self._work = threading.Event()
        self._stop_stepping = threading.Event()  # pause(): no step until resume()
        self._closed = False
        self._dead: BaseException | None = None
        self._idle_wait_s = idle_wait_s
        self._thread = threading.Thread(target=self._run, name="rollbank-colocated", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the stepping thread
    def _run(self) -> None:
        while not self._closed:
            self._work.clear()
            try:
                if self._aborts:
                    ids = []
                    while self._aborts:
                        ids.append(self._aborts.popleft())
                    self.engine.abort(ids)
                if self.engine.busy and not self._stop_stepping.is_set():
                    self.engine.step_once()
                    continue
            except Exception as exc:  # the engine failed: every waiting request learns it
                self._dead = exc
                for p in list(self._pending.values()):
                    p.sink(EngineDeadError(f"the colocated engine failed: {exc!r}", server=URL))
                return
            self._work.wait(self._idle_wait_s)

    # ------------------------------------------------------------ InferenceClient
    @property
    def base_url(self) -> str:
        return URL

    @property
    def policy_version(self) -> int:
        return self.engine.version

    @property
    def admission(self) -> AdmissionGate:
        return self._gate

    def set_admission(self, gate: AdmissionGate) -> None:
        self._gate = gate

    @property
    def inflight(self) -> int:
        return len(self._pending)

    @property
    def inflight_ids(self) -> tuple[str, ...]:
        return tuple(self._pending)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if request.lora is not None:
            raise BadRequestError("the colocated engine serves no LoRA adapters", server=URL,
                                  request_id=request.request_id)
        await self._gate.wait_open()
        if self._dead is not None or self._closed:
            raise EngineDeadError(f"the colocated engine is gone ({self._dead!r})", server=URL,
                                  request_id=request.request_id)
        loop = asyncio.get_running_loop()
        p = _Pending(request, self.engine, loop, loop.create_future(), time.monotonic())
        rid = request.request_id
        self._pending[rid] = p
        self._idle.clear()
        try:
            self.engine.submit(rid, request.prompt_token_ids, self._sampling(request.sampling), p.sink)
            self._work.set()
            try:
                return await asyncio.shield(p.future)
            except asyncio.CancelledError:
                self._aborts.append(rid)  # the engine must not go on generating for nobody
                self._work.set()
                raise
        except ValueError as exc:  # e.g. a prompt longer than the context, refused by vLLM
            raise BadRequestError(str(exc), server=URL, request_id=rid) from exc
        finally:
            self._pending.pop(rid, None)
            if not self._pending:
                self._idle.set()

    async def prompt_logprobs(self, token_ids: list[int], *, request_id: str) -> list[float]:
        """``out[t] = log p(token_ids[t] | token_ids[:t])`` by the engine (prefill, one
        throw-away token; ``out[0] = 0.0``): the divergence gate's scorer seam, as a server's."""
        await self._gate.wait_open()
        if not token_ids:
            return []
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()

        def settle(out: Any) -> None:
            if not done.done():
                done.set_result(out)

        def sink(out: Any) -> None:
            if out is None or isinstance(out, BaseException) or out.finished:
                loop.call_soon_threadsafe(settle, out)

        self.engine.submit(request_id, token_ids, self._sampling(None), sink)
        self._work.set()
        out = await done
        if isinstance(out, BaseException):
            raise BadRequestError(str(out), server=URL, request_id=request_id) from out
        if out is None:
            raise EngineDeadError("scoring was aborted", server=URL, request_id=request_id)
        entries = out.prompt_logprobs
        values = [(entries[t] or {}).get(tok) for t, tok in enumerate(token_ids) if t > 0]
        return [0.0, *checked_logprobs([None if v is None else v.logprob for v in values],
                                       server=URL, request_id=request_id)]

    async def abort(self, request_id: str) -> None:
        """The request returns with ``finish_reason="abort"`` and its partial tokens."""
        self._aborts.append(request_id)
        self._work.set()

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None:
        """``wait``: until in-flight requests finish; ``abort``: abort them; ``keep``: stop
        stepping (they resume where they were). No step runs until :meth:`resume`."""
        if mode == "wait":
            await self._idle.wait()
        elif mode == "abort":
            for rid in list(self._pending):
                await self.abort(rid)
        self._stop_stepping.set()
        if clear_cache:
            await self.reset_prefix_cache()

    async def resume(self) -> None:
        self._stop_stepping.clear()
        self._work.set()

    async def reset_prefix_cache(self, *, attempts: int = 20, reset_running_requests: bool = False) -> None:
        def reset() -> None:
            with self.engine.hold():
                self.engine.reset_prefix_cache()

        await asyncio.to_thread(reset)

    async def engine_version(self, request_id: str | None = None) -> int:
        return self.engine.version

    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        """Load a checkpoint directory into the engine between two steps, as ``version``."""
        from pathlib import Path

        from safetensors.torch import load_file

        def reload() -> None:
            pairs: list[tuple[str, Any]] = []
            for f in sorted(Path(weights_path).glob("*.safetensors")):
                pairs.extend(load_file(str(f)).items())
            with self.engine.hold():
                self.engine.load_weights(pairs)
                self.engine.set_version(version)
                self.engine.reset_prefix_cache()

        await asyncio.to_thread(reload)

    async def load_lora(self, name: str, path: str) -> None:
        raise BadRequestError("the colocated engine serves no LoRA adapters", server=URL)

    async def unload_lora(self, name: str) -> None:
        raise BadRequestError("the colocated engine serves no LoRA adapters", server=URL)

    async def health(self) -> bool:
        return self._dead is None and not self._closed and self._thread.is_alive()

    async def metrics(self) -> ServerMetrics:
        return ServerMetrics(running=len(self._pending), waiting=0, prefix_cache_queries=0.0,
                             prefix_cache_hits=0.0,
                             generation_tokens=float(self.engine.tokens_generated))

    async def aclose(self) -> None:
        self._closed = True
        self._work.set()
        await asyncio.to_thread(self._thread.join, 10.0)
        for p in list(self._pending.values()):  # nobody steps for them any more
            p.sink(EngineDeadError("the colocated engine was closed", server=URL,
                                   request_id=p.request.request_id))

