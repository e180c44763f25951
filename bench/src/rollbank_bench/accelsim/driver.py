"""The accelsim benchmark engine's asyncio driver: runs :class:`EngineCore` in wall time.

Owns :class:`EngineDriver`. One task loops: plan a step, sleep until its virtual end, apply it,
resolve the futures of finished requests. Back-to-back steps are scheduled on a virtual time line
(``end = previous end + duration``; the line restarts after an idle gap) so event-loop
wake-up lateness does not accumulate over steps. While idle the task waits on an event: no CPU is spent without work.

Control (vLLM 0.32 semantics as rollbank uses them)
- ``pause("abort")`` finishes everything in flight with ``abort``; ``pause("wait")`` lets
  submitted requests drain (returns when they have); ``pause("keep")`` freezes the step loop.
  While paused, new requests wait (at the HTTP layer) for :meth:`resume`.
- ``reload(path)`` switches the weights namespace of later tokens; ``set_version(label)`` names
  the weights (every later token carries that label in ``weight_versions``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from rollbank_bench.accelsim.core import EngineCore, SimRequest, Step
from rollbank_bench.accelsim.profile import LatencyProfile
from rollbank_bench.accelsim.tokens import TokenSource

CATCH_UP_S = 0.05  # lateness the virtual time line absorbs before it restarts


class EngineDriver:
    """One emulated engine: submit requests, await results, control pause/weights/LoRA."""

    def __init__(self, profile: LatencyProfile, *, seed: int = 0, served_model: str = "accelsim") -> None:
        self.core = EngineCore(profile)
        self.profile = profile
        self.seed = seed
        self.served_model = served_model
        self.weights_path = "initial"
        self.loras: dict[str, str] = {}
        self.paused = False
        self._frozen = False
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._work = asyncio.Event()
        self._futures: dict[str, asyncio.Future[SimRequest]] = {}
        self._task: asyncio.Task[None] | None = None
        self._virtual_end = 0.0
        self.dead: BaseException | None = None

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="accelsim-step-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # a dead core's exception was already reported (self.dead, failed requests)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    # ------------------------------------------------------------------ requests
    def make_request(
        self,
        engine_id: str,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        min_tokens: int = 0,
        temperature: float = 1.0,
        stop_ids: Sequence[int] = (),
        lora: str | None = None,
        ignore_eos: bool = False,
    ) -> SimRequest:
        stops = frozenset(stop_ids)
        if self.profile.eos_token_id is not None and not ignore_eos:
            stops |= {self.profile.eos_token_id}
        cache_ns = f"lora:{lora}" if lora else "base"
        tokens = TokenSource(
            seed=self.seed, namespace=f"{self.weights_path}|{cache_ns}", prompt=prompt,
            vocab_size=self.profile.vocab_size, temperature=temperature, request_id=engine_id,
            avoid=stops,
        )
        return SimRequest(engine_id=engine_id, prompt=list(prompt), max_tokens=max_tokens,
                          tokens=tokens, namespace=cache_ns, min_tokens=min_tokens, stop_ids=stops)

    async def generate(self, req: SimRequest) -> SimRequest:
        """Queue ``req`` (after any pause) and return it finished; cancelling aborts it."""
        await self._resumed.wait()
        if self.dead is not None:
            raise RuntimeError(f"accelsim engine core died: {self.dead!r}")
        fut: asyncio.Future[SimRequest] = asyncio.get_running_loop().create_future()
        self._futures[req.engine_id] = fut
        self.core.add(req, self.now())
        self._work.set()
        try:
            return await fut
        except asyncio.CancelledError:
            self.core.abort(req.engine_id, self.now())
            raise
        finally:
            self._futures.pop(req.engine_id, None)

    def abort(self, engine_ids: Sequence[str]) -> int:
        n = 0
        for eid in engine_ids:
            req = self.core.abort(eid, self.now())
            if req is not None:
                self._resolve([req])
                n += 1
        return n

    def _resolve(self, reqs: Sequence[SimRequest]) -> None:
        for req in reqs:
            fut = self._futures.get(req.engine_id)
            if fut is not None and not fut.done():
                fut.set_result(req)

    # ------------------------------------------------------------------ loop
    async def _loop(self) -> None:
        try:
            await self._steps()
        except Exception as exc:  # a bug in the core: fail every request, report unhealthy
            self.dead = exc
            for fut in self._futures.values():
                if not fut.done():
                    fut.set_exception(RuntimeError(f"accelsim engine core died: {exc!r}"))
            raise

    async def _steps(self) -> None:
        while True:
            if self._frozen:
                await self._resumed.wait()
                continue
            now = self.now()
            step = self.core.plan(now)
            if step is None:
                self._work.clear()
                await self._work.wait()
                self._virtual_end = self.now()  # idle gap: the time line restarts now
                continue
            await self._run_step(step, now)

    async def _run_step(self, step: Step, now: float) -> None:
        # back to back: wake-up lateness never adds up; after a long stall (frozen, starved
        # host) the line restarts rather than replaying missed steps at once
        base = self._virtual_end if now - self._virtual_end < CATCH_UP_S else now
        end = base + step.duration
        self._virtual_end = end
        delay = end - self.now()
        if delay > 0:
            await asyncio.sleep(delay)
        self._resolve(self.core.apply(step, self.now()))

    # ------------------------------------------------------------------ control
    async def pause(self, mode: str = "wait", *, clear_cache: bool = True) -> None:
        self.paused = True
        self._resumed.clear()
        if mode == "abort":
            self._resolve(self.core.abort_all(self.now()))
        elif mode == "wait":
            pending = [f for f in self._futures.values() if not f.done()]
            if pending:
                await asyncio.wait(pending)
        elif mode == "keep":
            self._frozen = True
        else:
            raise ValueError(f"unknown pause mode {mode!r}")
        if clear_cache and mode != "keep":
            self.core.reset_cache()

    def resume(self) -> None:
        self.paused = False
        self._frozen = False
        self._resumed.set()
        self._work.set()

    def reload(self, weights_path: str) -> None:
        self.weights_path = weights_path

    def set_version(self, label: str) -> None:
        self.core.weight_version = label
