"""Virtual-time simulation: the real scheduler policy over a scripted workload, no I/O.

A discrete-event loop drives :class:`~rollbank.scheduling.policy.scheduler.Scheduler` with a
:class:`~rollbank.clock.FakeClock`. An attempt holds a sandbox slot from its launch: first
``duration_s`` (sandbox start, or the whole episode when it has no turns), then each of its
:class:`~rollbank.scheduling.sim.sim_model.SimTurn` — a generate call that waits for the
scheduler's inference slot on its group's server and takes the
:class:`~rollbank.scheduling.sim.sim_model.LatencyProfile`'s time (prefill of the uncached prompt
tokens, decode at the batch size it joins), then the turn's tool time — then, if
``verify_s`` > 0, the verifier, inside the scheduler's verifier slot. Aborts cancel waits
and free held slots. The grant, launch, straggler and batch decisions are the real policy's.

The scheduler is polled after each event that can change its decisions (an attempt returned
or was aborted, contention ended while extras were held), as the asyncio driver does.

Long-context model (a profile with ``decode_s_per_ctx_token`` or ``kv_tokens``): a granted
call waits for KV room, then decodes on its server's
:class:`~rollbank.scheduling.sim.fluid.FluidServer` beside the calls in service there, one
finish event per server on the heap (an event predicted before the server's calls changed is
stale and skipped); its fixed ``call_s`` comes after it leaves the engine. With a ``router``
in the capacity, the real router places each call before it asks for its inference slot (as
the runner does) and hears of its finish or abort; the prefix cache is then per server, held
prefixes evicted least recently used (:meth:`_Sim.cache_hit`).

Invariant: the simulation ends with the scheduler closed, so every launched attempt is
settled (``consumed``, ``retried`` or ``waste``) when :func:`simulate` returns.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from rollbank.batching.batch import Batch, Unreachable
from rollbank.clock import FakeClock
from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.routing.router import RouteRequest
from rollbank.scheduling.config import SchedulerConfig
from rollbank.scheduling.policy.events import Event
from rollbank.scheduling.policy.ledger import AttemptState
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import Abort, AttemptKey, AttemptSpec, EmitBatch, Launch
from rollbank.scheduling.sim.fluid import FluidServer
from rollbank.scheduling.sim.sim_model import SimCapacity, SimTurn


@dataclass(frozen=True)
class SimEpisode:
    """What the workload says about one attempt (see the module docstring)."""

    duration_s: float
    reason: Reason = Reason.VERIFIED_PASS
    reward: float | None = 1.0
    turns: tuple[SimTurn, ...] = ()
    verify_s: float = 0.0


@dataclass(frozen=True)
class SimResult:
    batches: tuple[Batch, ...]
    unreachable: tuple[Unreachable, ...]  # tasks given up on at the re-queue cap
    end_s: float  # virtual time when the last batch was emitted
    launched: int
    consumed: int
    retried: int
    waste: int
    sandbox_busy_s: float  # slot-seconds held by attempts (consumed + retried + waste)
    inference_busy_s: float = 0.0  # slot-seconds of generate calls
    inference_wait_s: float = 0.0  # seconds generate calls waited for an inference slot
    verifier_wait_s: float = 0.0  # seconds finished episodes waited for a verifier slot
    prefill_tokens: int = 0  # prompt tokens prefilled (not cached)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    trajectories: int = 0  # trajectories delivered in the batches

    @property
    def batch_times(self) -> list[float]:
        return [b.time_to_batch_s for b in self.batches]


# phases of a running attempt (also the event kinds of the heap)
_STEP, _GEN, _VER = 0, 1, 2
_WAIT_INF, _WAIT_VER, _WAIT_KV = 3, 4, 5


class _Run:
    __slots__ = ("context", "ep", "ids", "kv", "phase", "prefill", "rid", "server", "since",
                 "spec", "turn")

    def __init__(self, spec: AttemptSpec, ep: SimEpisode, server: str) -> None:
        self.spec = spec
        self.ep = ep
        self.server = server
        self.turn = 0
        self.phase = _STEP
        self.since = 0.0  # when the current wait started
        self.context = 0  # tokens in the conversation so far
        self.kv = 0  # context tokens this call holds in the server's KV (long-context model)
        self.prefill = 0  # a call waiting for KV room: its uncached prompt tokens
        self.ids: list[int] = []  # routed by the real router: the conversation's token ids
        self.rid = ""  # routed: the request id of the call in progress


class _Sim:
    def __init__(self, sched: Scheduler, cap: SimCapacity, clock: FakeClock) -> None:
        self.s = sched
        self.cap = cap
        self.clock = clock
        self.heap: list[tuple[float, int, int, AttemptKey]] = []
        self.n = 0
        self.live: dict[AttemptKey, _Run] = {}
        self.cached: set[tuple[str, str]] = set()  # (server, group id): task prompt cached
        self.wake = True  # poll the scheduler before the next event
        self.inf_busy = self.inf_wait = self.ver_wait = 0.0
        self.prefill = self.cached_tokens = 0
        self.outcomes: dict[tuple[Reason, float | None], EpisodeOutcome] = {}
        self.servers = [cap.server_of(i) for i in range(cap.servers)]  # server_of, cached
        self.router = cap.router(self.servers, clock) if cap.router is not None else None
        prof = cap.profile
        self.long_ctx = prof.decode_s_per_ctx_token > 0 or prof.kv_tokens > 0
        self.kv_used = dict.fromkeys(self.servers, 0)  # long-context model: KV in service
        self.kv_queue: dict[str, deque[AttemptKey]] = {s: deque() for s in self.servers}
        # long-context model: each server's decode as a fluid (rollbank.scheduling.sim.fluid),
        # the heap holding one finish event per server, the latest (older ones are stale)
        d, slope = prof.decode_s_per_token, prof.decode_batch_slope
        self.fluid: dict[str, FluidServer[AttemptKey]] = {
            s: FluidServer(d * (1.0 - slope), d * slope, prof.decode_s_per_ctx_token)
            for s in self.servers}
        self.fin_event = dict.fromkeys(self.servers, -1)
        self.dirty: set[str] = set()  # servers whose next finish must be re-pushed
        self.tok = 1  # routed: the next synthetic token id
        self.group_ids: dict[str, range] = {}  # routed: each group's task-prompt ids
        # routed: what each server's prefix cache holds besides the calls in service (a
        # conversation by attempt id: its context when its last call left; a group's task
        # prompt by group id), least recently used first, evicted when the calls in service
        # need the room (the engine's KV is shared by both)
        self.held: dict[str, OrderedDict[str, int]] = {s: OrderedDict() for s in self.servers}
        self.held_total = dict.fromkeys(self.servers, 0)
        self.gen_used = dict.fromkeys(self.servers, 0)  # routed: running calls' output tokens

    def push(self, t: float, phase: int, key: AttemptKey) -> None:
        self.n += 1
        heapq.heappush(self.heap, (t, self.n, phase, key))

    def launch(self, spec: AttemptSpec, ep: SimEpisode, now: float) -> None:
        key = spec.key
        servers = self.servers
        self.live[key] = _Run(spec, ep, servers[key.seq % len(servers)])
        self.n += 1
        heapq.heappush(self.heap, (now + ep.duration_s, self.n, _STEP, key))

    def step(self, key: AttemptKey, run: _Run, now: float) -> None:
        """The sandbox is free to go on: next generate call, or the verifier, or return."""
        if run.turn < len(run.ep.turns):
            if self.router is not None:
                self.route(key, run)
            if self.s.slots.request_inference(key, run.server):
                self.generate(key, run, now)
            else:
                run.phase, run.since = _WAIT_INF, now
        elif run.ep.verify_s > 0:
            if self.s.slots.request_verifier(key):
                run.phase = _VER
                self.push(now + run.ep.verify_s, _VER, key)
            else:
                run.phase, run.since = _WAIT_VER, now
        else:
            self.finish(key, run, now)

    def route(self, key: AttemptKey, run: _Run) -> None:
        """The real router places the next call (its prompt: the conversation so far plus the
        turn's new tokens, synthetic ids)."""
        assert self.router is not None
        prompt = run.ep.turns[run.turn].prompt_tokens
        if run.turn == 0:
            ids = self.group_ids.get(key.group_id)
            if ids is None:
                ids = self.group_ids[key.group_id] = range(self.tok, self.tok + prompt)
                self.tok += prompt
            run.ids.extend(ids)
        else:
            run.ids.extend(range(self.tok, self.tok + prompt))
            self.tok += prompt
        run.rid = f"{key.attempt_id}/t{run.turn}"
        run.server = self.router.route(RouteRequest(run.rid, key.attempt_id, key.group_id,
                                                    run.ids))

    def generate(self, key: AttemptKey, run: _Run, now: float) -> None:
        turn = run.ep.turns[run.turn]
        prompt = turn.prompt_tokens
        if self.router is not None:
            prefill = run.context + prompt - self.cache_hit(key, run)
            run.ids.extend(range(self.tok, self.tok + turn.tokens))  # what it generates
            self.tok += turn.tokens
        elif not self.cap.prefix_cache:
            prefill = run.context + prompt
        elif run.turn == 0 and (run.server, key.group_id) in self.cached:
            prefill = 0
        else:
            prefill = prompt
            if run.turn == 0:
                self.cached.add((run.server, key.group_id))
        self.prefill += prefill
        self.cached_tokens += run.context + prompt - prefill
        run.context += prompt + turn.tokens
        if self.long_ctx:
            run.prefill = prefill
            kv, used = self.cap.profile.kv_tokens, self.kv_used[run.server]
            if kv and used and (self.kv_queue[run.server] or used + run.context > kv):
                run.phase = _WAIT_KV  # the engine has no KV room: wait, holding the slot
                self.kv_queue[run.server].append(key)
                return
            self.start_call(key, run, now)
            return
        svc = self.cap.profile.generate_s(prefill, turn.tokens,
                                          self.s.inference.in_use(run.server))
        self.inf_busy += svc
        run.phase = _GEN
        self.push(now + svc, _GEN, key)

    def cache_hit(self, key: AttemptKey, run: _Run) -> int:
        """Routed: the cached prefix of this call's prompt on its server, as the engine's
        prefix cache (``rollbank_bench.accelsim.core``) holds it: the group's task prompt, then
        the conversation's own tokens after it, if held there (nothing matches past a missing
        prefix). The prompt is held (most recently used) from here on."""
        server, held = run.server, self.held[run.server]
        first = run.ep.turns[0].prompt_tokens
        group = f"group:{key.group_id}"
        cached = first + held.get(key.attempt_id, 0) if group in held else 0
        self.hold(server, key.attempt_id, run.context + run.ep.turns[run.turn].prompt_tokens
                  - first)
        self.hold(server, group, first)
        return cached

    def hold(self, server: str, entry: str, tokens: int) -> None:
        """Routed: ``entry`` holds ``tokens`` in ``server``'s prefix cache, most recently used."""
        held = self.held[server]
        self.held_total[server] += tokens - held.pop(entry, 0)
        held[entry] = tokens
        self.evict(server)

    def evict(self, server: str) -> None:
        """Routed: drop least recently used prefixes down to the cache's room: the engine's KV
        less the running calls' outputs (their prompts are in the cache)."""
        kv, held = self.cap.profile.kv_tokens, self.held[server]
        while kv and held and self.gen_used[server] + self.held_total[server] > kv:
            self.held_total[server] -= held.popitem(last=False)[1]

    def start_call(self, key: AttemptKey, run: _Run, now: float) -> None:
        """Long-context model: the call enters the engine, its context held in KV, and decodes
        with the calls in service on its server as they come and go (:class:`FluidServer`)."""
        run.kv = run.context
        self.kv_used[run.server] += run.kv
        tokens = run.ep.turns[run.turn].tokens
        if self.router is not None:  # its output's KV is outside the prefix cache until it ends
            self.gen_used[run.server] += tokens
            self.evict(run.server)
        self.fluid[run.server].admit(key, now, run.context - tokens, tokens,
                                     run.prefill * self.cap.profile.prefill_s_per_token)
        self.dirty.add(run.server)
        run.phase, run.since = _GEN, now

    def leave_engine(self, key: AttemptKey, run: _Run, now: float) -> None:
        """Long-context model: the call leaves its server (finished or aborted)."""
        self.fluid[run.server].remove(key, now)
        self.dirty.add(run.server)
        self.inf_busy += now - run.since
        if self.router is not None:  # its output enters the prefix cache (evicted LRU)
            tokens = run.ep.turns[run.turn].tokens
            self.gen_used[run.server] -= tokens
            self.hold(run.server, key.attempt_id, self.held[run.server].get(key.attempt_id, 0)
                      + tokens)
        self.free_kv(run, now)

    def reschedule(self) -> None:
        """Long-context model: push each changed server's next finish (older ones go stale)."""
        for server in self.dirty:
            nxt = self.fluid[server].next_finish()
            if nxt is None:
                self.fin_event[server] = -1
            else:
                self.push(nxt[0], _GEN, nxt[1])
                self.fin_event[server] = self.n
        self.dirty.clear()

    def free_kv(self, run: _Run, now: float) -> None:
        """Long-context model: a call left the engine; admit waiting calls that now fit."""
        server = run.server
        self.kv_used[server] -= run.kv
        run.kv = 0
        queue, kv = self.kv_queue[server], self.cap.profile.kv_tokens
        while queue:
            nxt = self.live[queue[0]]
            if self.kv_used[server] and self.kv_used[server] + nxt.context > kv:
                break
            self.start_call(queue.popleft(), nxt, now)

    def generated(self, key: AttemptKey, run: _Run, now: float) -> None:
        tool = run.ep.turns[run.turn].tool_s
        if self.router is not None:
            self.router.on_finish(run.server, run.rid)
        if self.long_ctx:  # the call's fixed cost (HTTP, tokenisation) outside the engine
            self.leave_engine(key, run, now)
            tool += self.cap.profile.call_s
        self.release_inference(key, run.server, now)
        run.turn += 1
        run.phase = _STEP
        self.push(now + tool, _STEP, key)

    def verified(self, key: AttemptKey, run: _Run, now: float) -> None:
        self.release_verifier(key, now)
        self.finish(key, run, now)

    def release_inference(self, key: AttemptKey, server: str, now: float) -> None:
        for g in self.s.slots.release_inference(key, server):
            grun = self.live[g]
            self.inf_wait += now - grun.since
            self.generate(g, grun, now)
        if self.s.holding_extras and not self.s.inference.contended():
            self.wake = True

    def release_verifier(self, key: AttemptKey, now: float) -> None:
        for g in self.s.slots.release_verifier(key):
            grun = self.live[g]
            self.ver_wait += now - grun.since
            grun.phase = _VER
            self.push(now + grun.ep.verify_s, _VER, g)
        if self.s.holding_extras and not self.s.slots.extras_contended():
            self.wake = True

    def finish(self, key: AttemptKey, run: _Run, now: float) -> None:
        del self.live[key]
        self.s.on_finished(key, self.trajectory(run, now))
        self.wake = True

    def trajectory(self, run: _Run, now: float) -> Trajectory:
        """The returned record: the scripted outcome and the episode's generated tokens."""
        ep, spec = run.ep, run.spec
        outcome = self.outcomes.get((ep.reason, ep.reward))
        if outcome is None:
            outcome = self.outcomes[(ep.reason, ep.reward)] = EpisodeOutcome.of(
                ep.reason, reward=ep.reward)
        key = spec.key
        n = (sum(t.tokens for t in ep.turns) or 1) if ep.turns else 1
        return Trajectory(
            trajectory_id=key.attempt_id, group_id=key.group_id, task_id=spec.task_id,
            attempt=key.slot, retry=key.retry, seed=spec.seed, launched_at=spec.launched_at,
            started_at=spec.launched_at, finished_at=now, outcome=outcome,
            token_ids=[100] * n, logprobs=[-0.5] * n, loss_mask=[1] * n,
            policy_versions=[0] * n, steps=[], task_steps=[], layer_hashes=[], servers=[],
            meta={})  # every container given: no default factory calls

    def abort(self, key: AttemptKey, now: float) -> None:
        run = self.live.pop(key, None)
        if run is not None:
            if self.router is not None and run.phase in (_WAIT_INF, _WAIT_KV, _GEN):
                self.router.on_abort(run.server, run.rid)
            if run.phase == _WAIT_INF:
                self.s.slots.cancel_inference_wait(key, run.server)
            elif run.phase == _WAIT_KV:
                self.kv_queue[run.server].remove(key)
                self.release_inference(key, run.server, now)
            elif run.phase == _GEN:
                if self.long_ctx:
                    self.leave_engine(key, run, now)
                self.release_inference(key, run.server, now)
            elif run.phase == _WAIT_VER:
                self.s.slots.cancel_verifier_wait(key)
            elif run.phase == _VER:
                self.release_verifier(key, now)
        self.s.on_aborted(key)
        self.wake = True

    def dispatch(self, t: float, n: int, phase: int, key: AttemptKey) -> None:
        run = self.live.get(key)
        if run is None or run.phase != phase:
            return  # aborted earlier
        if phase == _STEP:
            self.step(key, run, t)
        elif phase == _GEN:
            if self.long_ctx and self.fin_event[run.server] != n:
                return  # a finish predicted before its server's calls changed
            self.generated(key, run, t)
        else:
            self.verified(key, run, t)
        if self.dirty:
            self.reschedule()


def simulate(
    config: SchedulerConfig,
    task_ids: Sequence[str],
    workload: Callable[[AttemptSpec], SimEpisode],
    *,
    capacity: SimCapacity | None = None,
    max_events: int = 100_000_000,
    events: list[Event] | None = None,
    keep_trajectories: bool = True,
) -> SimResult:
    """Run ``config`` over ``workload`` in virtual time; lifecycle events go to ``events``.

    ``keep_trajectories=False`` (long runs): the returned batches keep their accounting and
    profile but not their groups, so a million trajectories are not all held in memory
    (their number is :attr:`SimResult.trajectories`)."""
    sink = events
    clock = FakeClock()
    sched = Scheduler(config, task_ids, clock, record_events=sink is not None)
    sim = _Sim(sched, capacity or SimCapacity(), clock)
    batches: list[Batch] = []
    delivered = 0
    heap, pop, poll, dispatch = sim.heap, heapq.heappop, sched.poll, sim.dispatch
    for _ in range(max_events):
        if sim.wake:
            sim.wake = False
            now = clock.now()
            for d in poll():
                if isinstance(d, Launch):
                    sim.launch(d.spec, workload(d.spec), now)
                elif isinstance(d, Abort):
                    sim.abort(d.key, now)
                elif isinstance(d, EmitBatch):
                    delivered += len(d.batch.trajectories)
                    batches.append(d.batch if keep_trajectories else replace(d.batch, groups=()))
                    sched.ack(d.batch.index)  # the simulated consumer takes every batch at once
            if sim.dirty:
                sim.reschedule()
            if sink is not None:
                sink += sched.drain_events()
        if sched.done or not heap:
            break
        t, n, phase, key = pop(heap)
        clock.set(t)
        dispatch(t, n, phase, key)
    end = clock.now()
    sched.close()
    if sink is not None:
        sink += sched.drain_events()
    ledger = sched.bank.ledger
    counts = ledger.counts()
    return SimResult(
        batches=tuple(batches),
        unreachable=tuple(sched.unreachable),
        end_s=batches[-1].ready_at if batches else end,
        launched=len(ledger.entries),
        consumed=counts[AttemptState.CONSUMED],
        retried=counts[AttemptState.RETRIED],
        waste=counts[AttemptState.WASTE],
        sandbox_busy_s=sum(e.held_s(end) for e in ledger.entries.values()),
        inference_busy_s=sim.inf_busy, inference_wait_s=sim.inf_wait,
        verifier_wait_s=sim.ver_wait, prefill_tokens=sim.prefill,
        cached_tokens=sim.cached_tokens, trajectories=delivered,
    )
