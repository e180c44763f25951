"""One inference server's decode as a fluid, for the simulator's long-context model. Pure, no I/O.

A continuous-batching engine decodes one token of every call in service per step, and a step
lasts ``base + per_seq * b + per_ctx * C`` seconds: ``b`` calls in service, ``C`` the sum of
their contexts, each growing by one token per step (the accelsim engine's step model). Between
two changes of the set (a call admitted or finished), every call advances by the same number of
tokens, so the server keeps one counter ``V`` (tokens each call in service has decoded since the
server started) and a call admitted at ``V0`` with ``n`` tokens to generate finishes when ``V``
reaches ``V0 + n``. With ``C(V) = S + b V`` (``S`` the sum of ``context0 - V0`` over the calls),
the time from ``V1`` to ``V2`` is the integral of the step time::

    dt = (base + per_seq b + per_ctx S) (V2 - V1) + per_ctx b (V2^2 - V1^2) / 2

so the next finish is exact and each change costs O(log b). A call's prefill stalls the
server's decode for its prefill seconds (a step that prefills is longer for every sequence in
it); the call starts decoding when the stall ends.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class FluidServer(Generic[K]):
    """Calls in service on one server (see the module docstring). Keys are the caller's."""

    __slots__ = ("_admitted", "_heap", "_in", "base", "last", "per_ctx", "per_seq", "stall_until",
                 "sum0", "v")

    def __init__(self, base_s: float, per_seq_s: float, per_ctx_s: float) -> None:
        self.base, self.per_seq, self.per_ctx = base_s, per_seq_s, per_ctx_s
        self.v = 0.0  # tokens every call in service has decoded since the server started
        self.last = 0.0  # when v was last brought up to date
        self.stall_until = 0.0  # prefill in progress: no decode before this time
        self.sum0 = 0.0  # sum over calls in service of (context at admission - v at admission)
        # key -> (v at admission, target v, context at admission)
        self._in: dict[K, tuple[float, float, int]] = {}
        self._heap: list[tuple[float, int, K]] = []  # (target v, admission, key), lazy deletes
        self._admitted = 0  # admissions so far: equal targets finish in admission order

    def __len__(self) -> int:
        return len(self._in)

    def _rate(self) -> tuple[float, float]:
        """(seconds per token at v = 0 extrapolated, seconds per token per unit of v)."""
        b = len(self._in)
        return self.base + self.per_seq * b + self.per_ctx * self.sum0, self.per_ctx * b

    def advance(self, now: float) -> None:
        """Bring ``v`` up to ``now`` (no decode before the stall ends)."""
        start = max(self.last, self.stall_until)
        if now > start and self._in:
            alpha, beta = self._rate()
            r, dt = alpha + beta * self.v, now - start
            # r u + beta u^2 / 2 = dt, solved stably (beta = 0: u = dt / r)
            self.v += 2.0 * dt / (r + math.sqrt(r * r + 2.0 * beta * dt))
        self.last = max(self.last, now)

    def admit(self, key: K, now: float, context: int, tokens: int,
              prefill_s: float) -> None:
        """``key`` enters with ``context`` tokens before its first generated one, ``tokens`` to
        generate, ``prefill_s`` of prefill."""
        self.advance(now)
        if not self._in:
            self.v = self.sum0 = 0.0  # an idle server restarts its counter (no float drift)
        if prefill_s > 0:
            self.stall_until = max(now, self.stall_until) + prefill_s
        target = self.v + tokens
        self._in[key] = (self.v, target, context)
        self.sum0 += context - self.v
        self._admitted += 1
        heapq.heappush(self._heap, (target, self._admitted, key))

    def remove(self, key: K, now: float) -> None:
        """``key`` leaves (finished, or aborted mid-call)."""
        self.advance(now)
        v0, _, context = self._in.pop(key)
        self.sum0 -= context - v0

    def next_finish(self) -> tuple[float, K] | None:
        """(time, key) of the next call to finish if nothing changes, or None when idle."""
        heap = self._heap
        while heap and (heap[0][2] not in self._in or self._in[heap[0][2]][1] != heap[0][0]):
            heapq.heappop(heap)  # removed (or re-admitted under a new target)
        if not heap:
            return None
        target, _, key = heap[0]
        alpha, beta = self._rate()
        u = max(0.0, target - self.v)
        start = max(self.last, self.stall_until)
        return start + (alpha + beta * self.v) * u + beta * u * u / 2.0, key
