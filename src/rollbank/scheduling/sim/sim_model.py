"""What the virtual-time simulator models besides sandbox slots: inference and verifiers.

- :class:`LatencyProfile`: an inference server as data — prefill seconds per uncached prompt
  token, decode seconds per generated token as a function of the batch size (the generate
  calls holding an inference slot on that server when the call is granted, itself included).
- :class:`SimCapacity`: servers, the profile, the prefix cache switch. Inference slots per
  server and verifier slots are the scheduler's own (``SchedulerConfig``), so the simulator
  runs the same grant policy as the driver.
- :class:`SimTurn`: one turn of a simulated episode (new prompt tokens, generated tokens,
  tool seconds).

Prefix cache model: a group's attempts go to one server (``seq % servers``, group affinity,
what the cache-aware router aims for). The group's task prompt (turn 0's new tokens) is
prefilled once per server and is free for every later sibling there; later turns prefill only
their new (observation) tokens, the conversation before them being cached. The cache is
unbounded (no eviction). Pure data and arithmetic; no I/O.

Long contexts (both off by default, which is the model above exactly):
``decode_s_per_ctx_token`` charges every decode step for the KV read of the contexts of the
calls in service on the server at that step (itself included, each growing a token a step:
:mod:`rollbank.scheduling.sim.fluid`), so a turn late in a long conversation decodes slower
and speeds up as its neighbours leave; ``kv_tokens`` caps those contexts' sum per server (the
engine's KV cache): a call that does not fit waits, holding its inference slot, until calls
finish (FIFO), as vLLM's admission without preemption (and accel-sim) does. With a ``router``
(the real one, built on the simulation's clock) every call goes where it says, and the prefix
cache is the engine's: a server holds the group prompts and conversations its calls left
there, least recently used evicted down to its KV less the running calls' outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollbank.clock import Clock
from rollbank.routing.router import Router


@dataclass(frozen=True)
class LatencyProfile:
    """Timing of one inference server. ``decode_s(b) = decode_s_per_token * (1 +
    decode_batch_slope * (b - 1))``: each extra sequence in the batch slows every token by
    ``decode_batch_slope`` of the single-sequence time. ``call_s``: fixed seconds every call
    costs around the engine's work (HTTP, tokenisation), measured by ``bench schedule
    --from-measured``."""

    name: str = "default"
    prefill_s_per_token: float = 0.0002
    decode_s_per_token: float = 0.005
    decode_batch_slope: float = 0.02
    call_s: float = 0.0  # fixed seconds per call (HTTP round trip, tokenisation, queueing)
    decode_s_per_ctx_token: float = 0.0  # per decode step, per context token in service
    kv_tokens: int = 0  # context tokens in service per server (0: unlimited)

    def decode_s(self, batch: int) -> float:
        return self.decode_s_per_token * (1.0 + self.decode_batch_slope * (max(1, batch) - 1))

    def generate_s(self, prefill_tokens: int, decode_tokens: int, batch: int) -> float:
        """Seconds of one generate call: uncached prefill, then decode at batch size ``batch``."""
        return (self.call_s + prefill_tokens * self.prefill_s_per_token
                + decode_tokens * self.decode_s(batch))


@dataclass(frozen=True)
class SimCapacity:
    """The inference side of a simulation (sandbox, inference and verifier slot counts are in
    ``SchedulerConfig``)."""

    servers: int = 1
    profile: LatencyProfile = LatencyProfile()
    prefix_cache: bool = True
    # the real router places every call (built on the servers and the simulation's clock;
    # the conversations' token ids are synthetic: a group's task prompt shared by its
    # siblings, every other token unique), and the prefix cache is the engine's (module notes)
    router: Callable[[Sequence[str], Clock], Router] | None = None

    def server_of(self, seq: int) -> str:
        return f"s{seq % self.servers}"


@dataclass(frozen=True)
class SimTurn:
    """``prompt_tokens`` new tokens before the call (turn 0: the group's shared task prompt;
    later: the observation), ``tokens`` generated, then ``tool_s`` in the sandbox."""

    prompt_tokens: int
    tokens: int
    tool_s: float = 0.0
