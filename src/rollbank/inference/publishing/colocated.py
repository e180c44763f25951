"""Colocated pattern: an in-process vLLM engine receives the trainer's tensors by reference.

:class:`ColocatedEngine` runs ``vllm.LLM`` inside the trainer's process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: engine core and worker are in this process too), and
steps it itself, one engine step at a time under a lock. :class:`ColocatedPublisher` applies
an update between two steps. With ``stage=True`` (default) it first reloads the
``(name, tensor)`` pairs into a shadow of the worker's model while generation goes on
(:mod:`~rollbank.inference.publishing.staged_reload`: same objects, no HTTP, no disk, no
serialisation), then takes the lock (generation stops), swaps the prepared tensors in, names
the version on the engine, resets the prefix cache and releases the lock. ``stage=False`` (the
earlier order) reloads the live model under the lock through
``collective_rpc("reload_weights", weights_iterator=...)``. Apply pause = lock held.

In-flight plans: ``pause`` (default; running requests continue after the swap, their KV is
recomputed and their later tokens come from the new weights) and ``abort`` (running requests are aborted and returned
with their partial tokens). ``finish`` is not offered: this engine has no admission of its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from rollbank.clock import Clock, MonotonicClock
from rollbank.errors import ConfigError, PublicationError
from rollbank.inference.engine_output import parse_version_label, version_label
from rollbank.inference.publishing.protocol import (
    InflightPlan,
    Pattern,
    PublicationRecord,
    WeightUpdate,
)
from rollbank.inference.publishing.staged_reload import StagedReload, vllm_layerwise_reload
from rollbank.inference.publishing.state import ServedWeights, validate


class InProcessEngine(Protocol):
    """What the colocated publisher needs from an in-process engine (fakes implement it)."""

    def hold(self) -> AbstractContextManager[None]:
        """Stop generation between two engine steps until the block exits."""
        ...

    def load_weights(self, pairs: Sequence[tuple[str, Any]]) -> None: ...

    def stage_weights(self, pairs: Sequence[tuple[str, Any]]) -> None:
        """Prepare ``pairs`` beside the serving weights (generation may go on)."""
        ...

    def swap_staged(self) -> None:
        """Install what :meth:`stage_weights` prepared (under :meth:`hold`)."""
        ...

    def discard_staged(self) -> None: ...

    def set_version(self, version: int) -> None: ...

    def engine_version(self) -> int: ...

    def reset_prefix_cache(self) -> bool: ...

    def abort_all(self) -> int: ...


#: where a submitted request's outputs go: each ``RequestOutput``, None when it is aborted, the
#: exception when the engine refused to add it
Sink = Callable[[Any], None]


class ColocatedEngine:
    """``vllm.LLM`` in this process, stepped under :attr:`lock`.

    Two ways to generate, which may be mixed: :meth:`generate` (blocking, from any thread:
    the caller steps the engine until its requests finish) and :meth:`submit` (a request whose
    outputs go to a sink; :meth:`step_once` steps for every request, called by one stepping
    thread, e.g. :class:`~rollbank.inference.publishing.colocated_client.ColocatedClient`'s).
    ``version`` is the version the weights in the engine have (set under the lock by
    :meth:`set_version`), so every step's tokens carry the version that produced them."""

    def __init__(self, model_dir: Path, *, dtype: str = "float32", max_model_len: int = 1024,
                 kv_cache_gib: int = 1, seed: int = 0, **llm_kwargs: Any) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)  # whole GiB on vLLM CPU
        from rollbank.inference import vllm_internals

        vllm_internals.require_symbols()  # the version and every internal used, before the start
        llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")  # as managed servers: after temperature
        self.llm = vllm_internals.llm_class()(
            model=str(model_dir), dtype=dtype, max_model_len=max_model_len, seed=seed,
            enable_prefix_caching=True, **llm_kwargs)
        vllm_internals.check_engine(self.llm.llm_engine)
        self._setup(self.llm.llm_engine)

    @classmethod
    def over(cls, engine: Any) -> ColocatedEngine:
        """Over an already built engine (an ``LLM.llm_engine``, or a fake with its methods)."""
        self = cls.__new__(cls)
        self.llm = None
        self._setup(engine)
        return self

    def _setup(self, engine: Any) -> None:
        self.engine = engine
        self.lock = threading.Lock()
        self._publisher_waiting = threading.Event()
        self._ids = itertools.count()
        self._done: dict[str, Any] = {}
        self._seen: dict[str, int] = {}
        self._waiting: set[str] = set()  # generate()'s requests not yet returned
        self._sinks: dict[str, Sink] = {}  # submitted: rid -> sink
        self._submitted: collections.deque[tuple[str, list[int], Any, Sink]] = \
            collections.deque()
        self.version = 0
        self.tokens_generated = 0  # output tokens produced by this engine so far
        self._staged_reload: StagedReload | None = None

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        self._publisher_waiting.set()  # the stepping thread yields the lock at its next step
        try:
            with self.lock:
                self._publisher_waiting.clear()
                yield
        finally:
            self._publisher_waiting.clear()

    def _yield_to_publisher(self) -> None:
        while self._publisher_waiting.is_set():
            time.sleep(0.0005)

    def _step_locked(self) -> None:
        """One engine step (the lock held): count tokens, route every output to its sink or
        to :meth:`generate`'s waiting callers."""
        for out in self.engine.step():
            n = len(out.outputs[0].token_ids) if out.outputs else 0
            self.tokens_generated += n - self._seen.get(out.request_id, 0)
            self._seen[out.request_id] = n
            sink = self._sinks.get(out.request_id)
            if out.finished:
                self._seen.pop(out.request_id, None)
                self._sinks.pop(out.request_id, None)
                if sink is None:
                    self._done[out.request_id] = out
            if sink is not None:
                sink(out)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Any) -> list[Any]:
        """Generate (blocking; call from a thread): one ``RequestOutput`` per prompt, None for
        a request aborted by a publication. Steps the engine one step per lock hold, so a
        publication can slip in between two steps."""
        rids = []
        with self.lock:
            for p in prompts:
                rid = f"colo-{next(self._ids)}"
                self.engine.add_request(rid, {"prompt_token_ids": list(p)}, sampling)
                rids.append(rid)
                self._waiting.add(rid)
        while not all(r in self._done for r in rids):
            self._yield_to_publisher()
            with self.lock:
                if all(r in self._done for r in rids):
                    break
                self._step_locked()
        self._waiting.difference_update(rids)
        return [self._done.pop(r) for r in rids]

    def submit(self, request_id: str, prompt: Sequence[int], sampling: Any,
               sink: Sink) -> None:
        """Queue a request (any thread, never blocks): the stepping thread adds it at its next
        step; ``sink`` gets each of its outputs (the last one ``finished``), None if it is
        aborted, or the ``ValueError`` vLLM refused it with. Call :meth:`step_once` to make
        progress."""
        self._submitted.append((request_id, list(prompt), sampling, sink))

    @property
    def busy(self) -> bool:
        """Requests submitted and not finished."""
        return bool(self._sinks or self._submitted)

    def step_once(self) -> None:
        """Add the submitted requests and run one engine step (blocking; the stepping thread)."""
        self._yield_to_publisher()
        with self.lock:
            while self._submitted:
                rid, prompt, sampling, sink = self._submitted.popleft()
                try:
                    self.engine.add_request(rid, {"prompt_token_ids": prompt}, sampling)
                except ValueError as exc:  # refused (e.g. longer than the context): its sink says so
                    sink(exc)
                    continue
                self._sinks[rid] = sink
            if self._sinks:
                self._step_locked()

    def abort(self, request_ids: Sequence[str]) -> None:
        """Abort submitted requests (their sinks get None); blocking, from the stepping thread
        or any other but the event loop's."""
        with self.lock:
            self._abort_locked(list(request_ids))

    def _abort_locked(self, ids: list[str]) -> None:
        queued = [q for q in list(self._submitted) if q[0] in ids]  # (a copy: append races)
        for q in queued:
            self._submitted.remove(q)
            q[3](None)
        never_added = {q[0] for q in queued}
        live = [r for r in ids if r not in never_added]
        if live:
            self.engine.abort_request(live)
        for rid in live:
            self._seen.pop(rid, None)
            sink = self._sinks.pop(rid, None)
            if sink is not None:
                sink(None)
            elif rid in self._waiting:  # a generate() caller's: it returns None for it
                self._done[rid] = None

    def load_weights(self, pairs: Sequence[tuple[str, Any]]) -> None:
        self.engine.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": list(pairs), "is_checkpoint_format": True})

    def _reloader(self) -> StagedReload:
        if self._staged_reload is None:
            from rollbank.inference.vllm_internals import worker_model

            with self.lock:  # the worker's model, fetched once between two steps
                model, model_config = worker_model(self.engine)
            self._staged_reload = StagedReload(model, vllm_layerwise_reload(model_config))
        return self._staged_reload

    def stage_weights(self, pairs: Sequence[tuple[str, Any]]) -> None:
        # outside the lock: the reload runs on the worker's shadow model, the live one is read
        self._reloader().stage(list(pairs))

    def swap_staged(self) -> None:
        self._reloader().swap()

    def discard_staged(self) -> None:
        if self._staged_reload is not None:
            self._staged_reload.discard()

    def set_version(self, version: int) -> None:
        self.engine.set_weight_version(version_label(version))
        self.version = version

    def engine_version(self) -> int:
        return parse_version_label(self.engine.get_weight_version(), server="colocated")

    def reset_prefix_cache(self) -> bool:
        # running requests are preempted (their KV recomputed with the new weights), so the
        # cache can be emptied between two steps
        return bool(self.engine.reset_prefix_cache(reset_running_requests=True))

    def abort_all(self) -> int:
        """Abort every running request (under :meth:`hold`); :meth:`generate` returns None for
        each of them: with this engine the abort plan drops partial tokens."""
        from rollbank.inference.vllm_internals import running_request_ids

        ids = running_request_ids(self.engine)
        self._abort_locked(ids)
        return len(ids)


class ColocatedPublisher:
    """Publishes state dicts into an in-process engine between two of its steps."""

    def __init__(self, engine: InProcessEngine, served: ServedWeights, *,
                 plan: InflightPlan = "pause", compact: bool = True, version: int = 0,
                 clock: Clock | None = None, stage: bool = True) -> None:
        if plan == "finish":
            raise ConfigError("the colocated engine offers the pause and abort plans")
        self.engine = engine
        self.served = served
        self.plan: InflightPlan = plan
        self.compact = compact
        self.stage = stage
        self.clock = clock or MonotonicClock()
        self._version = version
        self.records: list[PublicationRecord] = []

    @property
    def pattern(self) -> Pattern:
        return "colocated"

    @property
    def wants_tensors(self) -> bool:
        return True

    @property
    def version(self) -> int:
        return self._version

    def _apply(self, send: dict[str, Any], previous: dict[str, Any], version: int,
               steps: dict[str, float]) -> tuple[float, float, BaseException | None]:
        """Under the lock (generation stopped): load, name, reset; roll back on failure."""
        eng = self.engine
        if self.stage:  # generation goes on: the expensive reload happens beside it
            t = self.clock.now()
            eng.stage_weights(list(send.items()))
            steps["stage_s"] = self.clock.now() - t
        wait0 = self.clock.now()
        with eng.hold():
            paused_at = self.clock.now()
            steps["wait_step_s"] = paused_at - wait0
            if self.plan == "abort":
                steps["aborted"] = float(eng.abort_all())
            error: BaseException | None = None
            try:
                if self.stage:  # prepared before the hold: only the swap remains
                    eng.swap_staged()
                else:
                    eng.load_weights(list(send.items()))
                eng.set_version(version)
            except Exception as exc:
                error = exc
                try:
                    eng.load_weights(list(previous.items()))
                    eng.set_version(self._version)
                except Exception as exc2:  # cannot restore: the engine must not serve on
                    error = exc2
            steps["apply_s"] = (t := self.clock.now()) - paused_at
            steps["cache_reset_failed"] = float(not eng.reset_prefix_cache())
            resumed_at = self.clock.now()
            steps["reset_s"] = resumed_at - t
        return paused_at, resumed_at, error

    async def publish(
        self, update: WeightUpdate, *, version: int, ready_at: float | None = None
    ) -> PublicationRecord:
        ready = self.clock.now() if ready_at is None else ready_at
        serving = {"colocated": self._version}
        if update.tensors is None or update.lora:
            raise PublicationError("the colocated pattern publishes full-model tensors", serving=serving)
        validate(((n, tuple(t.shape)) for n, t in update.tensors.items()), self.served.reference,
                 serving=serving)
        steps: dict[str, float] = {}
        t0 = self.clock.now()
        send = self.served.changed(update.tensors, compact=self.compact)
        previous = self.served.previous_of(send)
        steps["diff_s"] = self.clock.now() - t0
        try:
            paused_at, resumed_at, error = await asyncio.to_thread(self._apply, send, previous, version, steps)
        except Exception as exc:  # staging failed: nothing was held or touched
            self.engine.discard_staged()
            raise PublicationError(f"staging version {version} failed ({exc!r}); engine keeps "
                                   f"version {self._version}", serving=serving) from exc
        now_serving = {"colocated": self.engine.engine_version()}
        nbytes = sum(int(t.numel()) * int(t.element_size()) for t in send.values())
        record = PublicationRecord(
            pattern="colocated", version=version, previous_version=self._version, plan=self.plan,
            ready_at=ready, paused_at=paused_at, resumed_at=resumed_at, serving_at=resumed_at,
            tensors=len(send), bytes=nbytes, steps_s=steps, serving=now_serving,
            ok=error is None, error=None if error is None else repr(error),
        )  # fmt: skip
        if error is not None:
            raise PublicationError(f"colocated publication of version {version} failed ({error!r}); "
                                   f"engine serves {now_serving}", serving=now_serving, record=record) from error
        self.served.commit(send)
        self._version = version
        self.records.append(record)
        return record

    async def aclose(self) -> None:
        return None
