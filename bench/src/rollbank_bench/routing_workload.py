"""The multi-turn GRPO workload of ``rollbank bench routing`` and the drivers that replay it.

Owns: :class:`Workload` (deterministic token-id conversations), :func:`run_arm` (one routing
arm against real servers, either through a rollbank :class:`~rollbank.routing.Router` or
through one HTTP endpoint such as a peer router) and the per-arm measurements.

Workload: ``groups`` GRPO groups of ``group_size`` siblings. Every prompt starts with a header
shared by all groups (the few-shot/system part), then the group's task tokens (shared by its
siblings). Each turn the conversation appends the tokens the model generated plus a synthetic
observation (random ids, seeded per conversation and turn), so prompts grow; a seeded pause
between turns stands in for tool latency. Sampling is at ``temperature`` (1.0 by default, so
GRPO siblings diverge from their first token as in training). Observations, their lengths
and the pauses are seeded and identical in every arm; sampled tokens are not (a per-request
seed kills vLLM CPU 0.32), so arms replay the same workload shape, not the same tokens.
``temperature=0`` replays identical tokens but makes siblings identical, which flatters
cache-blind policies (a sibling's turn lands where its twin already cached it).

Measurements (per arm, all from the servers' own answers):
- ``uncached_prefill_tokens``: sum over requests of prompt tokens minus
  ``usage.prompt_tokens_details.cached_tokens`` (per-request, vLLM
  ``--enable-prompt-tokens-details``);
- ``repeated_prefill_tokens``: per request, the part of the tokens an earlier turn of the same
  conversation already put on a server (previous prompt + previous generation) that was not
  served from cache, ``max(0, min(seen, prompt) - cached)``. Even perfect routing leaves the
  tail that does not fill a KV block (< block size per turn, which no server ever caches), so
  ``repeated_prefill_tokens_full_blocks`` counts only the earlier-turn tokens that a server
  could have held as full blocks (:func:`cacheable`) — the part routing decides;
- ``hit_rate``: ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` deltas from
  ``/metrics`` over the arm;
- load: ``running + waiting`` sampled from each server's ``/metrics`` every ``sample_s``
  (same method for every arm, peers included, since a peer router does not say where it sent
  a request); ``imbalance`` = max/min of the per-server time-averaged in-flight, and
  requests per server from ``vllm:request_success`` deltas;
- time: ``wall_s`` (first send to last answer), per request the client-measured time to first
  token (:func:`client_ttft`: round trip minus the engine's reported decode interval; no
  streaming, so every arm and both engines are measured the same way), and the engine's queue
  wait (``metrics.queue_time_ms``); p50/p95 by nearest rank. :meth:`ArmResult.timeline` keeps
  every request's send/first/done times and the sampled queue depth per server.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from rollbank.inference.protocol import GenerateRequest, InferenceClient, SamplingParams
from rollbank.inference.vllm_client import parse_prometheus
from rollbank.routing.router import Router, RouteRequest


@dataclass(frozen=True)
class Conv:
    trajectory_id: str
    group_id: str
    prompt: tuple[int, ...]
    observations: tuple[tuple[int, ...], ...]  # one per turn (the last is unused)
    pauses_s: tuple[float, ...]


@dataclass(frozen=True)
class Workload:
    groups: int
    group_size: int
    turns: int
    header_tokens: int
    task_tokens: int
    obs_tokens: tuple[int, int]
    max_tokens: int
    tool_pause_s: float
    vocab: tuple[int, int]  # id range [lo, hi) that avoids special tokens
    seed: int
    temperature: float = 1.0

    def conversations(self) -> list[Conv]:
        rng = random.Random(self.seed)
        lo, hi = self.vocab
        header = tuple(rng.randrange(lo, hi) for _ in range(self.header_tokens))
        out: list[Conv] = []
        for g in range(self.groups):
            task = tuple(rng.randrange(lo, hi) for _ in range(self.task_tokens))
            for k in range(self.group_size):
                r = random.Random(f"{self.seed}/{g}/{k}")
                obs = tuple(
                    tuple(r.randrange(lo, hi) for _ in range(r.randint(*self.obs_tokens)))
                    for _ in range(self.turns)
                )
                pauses = tuple(r.uniform(0.0, self.tool_pause_s) for _ in range(self.turns))
                out.append(Conv(f"g{g}s{k}", f"g{g}", header + task, obs, pauses))
        return out

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, logprobs=False
        )


def cacheable(seen: int, prompt: int, block: int) -> int:
    """Tokens of ``seen`` a server could hold as full KV blocks for a ``prompt``-long request
    (vLLM caches full blocks only, and never serves the last prompt token from cache)."""
    return (max(0, min(seen - 1, prompt - 1)) // block) * block


@dataclass
class RequestRecord:
    trajectory_id: str
    turn: int
    server: str | None
    prompt_tokens: int
    cached_tokens: int | None
    seen_before: int
    generated: int
    t_send: float = 0.0  # seconds since the arm started: the request left the client
    t_done: float = 0.0  # ... its answer arrived
    ttft_s: float | None = None  # client: send -> first token (see :func:`client_ttft`)
    queue_s: float | None = None  # engine: arrival -> scheduled
    engine_ttft_s: float | None = None  # engine: arrival -> first token


def client_ttft(total_s: float, decode_s: float | None) -> float | None:
    """Client-measured time to first token without streaming: the client's round trip (send
    to answer) minus the engine's own first-token-to-last-token interval
    (``metrics.generation_time_ms``), i.e. send -> first token up to the answer's transfer."""
    return None if decode_s is None else max(0.0, total_s - decode_s)


def affinity_moves(records: Sequence[RequestRecord]) -> int | None:
    """Turns sent to a different server than the same conversation's previous turn (each one
    re-prefills the context there); None when the server is unknown (behind a peer router)."""
    if any(r.server is None for r in records):
        return None
    last: dict[str, tuple[int, str]] = {}
    moves = 0
    for r in sorted(records, key=lambda r: (r.trajectory_id, r.turn)):
        prev = last.get(r.trajectory_id)
        if prev is not None and prev[1] != r.server:
            moves += 1
        last[r.trajectory_id] = (r.turn, r.server or "")
    return moves


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


@dataclass
class ArmResult:
    name: str
    kind: str
    wall_s: float = 0.0
    records: list[RequestRecord] = field(default_factory=list)
    samples: list[list[int]] = field(default_factory=list)  # per sample, in-flight per server
    sample_times: list[float] = field(default_factory=list)  # seconds since the arm started
    metrics_delta: list[dict[str, float]] = field(default_factory=list)
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self, urls: Sequence[str], block: int) -> dict[str, Any]:
        recs = self.records
        cached_known = all(r.cached_tokens is not None for r in recs)
        prompt = sum(r.prompt_tokens for r in recs)
        cached = sum(r.cached_tokens or 0 for r in recs)
        repeated = sum(
            max(0, min(r.seen_before, r.prompt_tokens) - (r.cached_tokens or 0)) for r in recs
        )
        seen = sum(min(r.seen_before, r.prompt_tokens) for r in recs)
        repeated_blocks = sum(
            max(0, cacheable(r.seen_before, r.prompt_tokens, block) - (r.cached_tokens or 0))
            for r in recs
        )
        hits = sum(d.get("vllm:prefix_cache_hits_total", 0.0) for d in self.metrics_delta)
        queries = sum(d.get("vllm:prefix_cache_queries_total", 0.0) for d in self.metrics_delta)
        n = len(urls)
        means = [
            sum(s[i] for s in self.samples) / len(self.samples) if self.samples else 0.0
            for i in range(n)
        ]
        per_server = [int(d.get("vllm:request_success_total", 0.0)) for d in self.metrics_delta]
        lo, hi = (min(means), max(means)) if means else (0.0, 0.0)
        ttft = [r.ttft_s for r in recs if r.ttft_s is not None]
        queue = [r.queue_s for r in recs if r.queue_s is not None]
        engine_ttft = [r.engine_ttft_s for r in recs if r.engine_ttft_s is not None]
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "requests": len(recs),
            "prompt_tokens": prompt,
            "generated_tokens": sum(r.generated for r in recs),
            "uncached_prefill_tokens": prompt - cached if cached_known else None,
            "repeated_prefill_tokens": repeated if cached_known else None,
            "repeated_prefill_tokens_full_blocks": repeated_blocks if cached_known else None,
            "earlier_turn_tokens": seen,
            "hit_rate": round(hits / queries, 4) if queries else None,
            "hit_rate_per_request": round(cached / prompt, 4) if prompt and cached_known else None,
            "wall_s": round(self.wall_s, 2),
            "ttft_p50_s": _r(percentile(ttft, 50)),
            "ttft_p95_s": _r(percentile(ttft, 95)),
            "ttft_measured": len(ttft),
            "engine_ttft_p50_s": _r(percentile(engine_ttft, 50)),
            "engine_ttft_p95_s": _r(percentile(engine_ttft, 95)),
            "engine_queue_p50_s": _r(percentile(queue, 50)),
            "engine_queue_p95_s": _r(percentile(queue, 95)),
            "inflight_mean_per_server": [round(m, 2) for m in means],
            "imbalance_max_over_min": round(hi / lo, 3) if lo > 0 else None,
            "inflight_peak_per_server": [max((s[i] for s in self.samples), default=0) for i in range(n)],
            "requests_per_server": per_server,
            "requests_imbalance_max_over_min": _ratio(per_server),
            "affinity_moves": affinity_moves(recs),
        }
        if self.error:
            out["error"] = self.error
        out.update(self.extra)
        return out

    def timeline(self, urls: Sequence[str]) -> dict[str, Any]:
        """Per-request timeline and per-server queue depth over time (``--timeline``)."""
        index = {u: i for i, u in enumerate(urls)}
        return {
            "name": self.name,
            "servers": list(urls),
            "requests": [
                {"traj": r.trajectory_id, "turn": r.turn,
                 "server": index.get(r.server) if r.server is not None else None,
                 "send": round(r.t_send, 4), "first": _r(None if r.ttft_s is None
                                                         else r.t_send + r.ttft_s),
                 "done": round(r.t_done, 4), "queue": _r(r.queue_s), "prompt": r.prompt_tokens,
                 "cached": r.cached_tokens}
                for r in sorted(self.records, key=lambda r: r.t_send)
            ],
            "depth": [[round(t, 3), row] for t, row in zip(self.sample_times, self.samples,
                                                            strict=False)],
        }


def _ratio(values: Sequence[int]) -> float | None:
    smallest = min(values, default=0)
    return round(max(values) / smallest, 3) if smallest > 0 else None


# ---------------------------------------------------------------------- server metrics
async def scrape(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    resp = await http.get(f"{url}/metrics", timeout=10.0)
    resp.raise_for_status()
    return parse_prometheus(resp.text)


async def _sampler(
    http: httpx.AsyncClient, urls: Sequence[str], result: ArmResult, stop: asyncio.Event,
    period_s: float, t0: float,
) -> None:
    while not stop.is_set():
        row = []
        for u in urls:
            m = await scrape(http, u)
            row.append(int(m.get("vllm:num_requests_running", 0) + m.get("vllm:num_requests_waiting", 0)))
        result.samples.append(row)
        result.sample_times.append(time.monotonic() - t0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period_s)


# ---------------------------------------------------------------------- arm driver
Dispatch = Callable[[RouteRequest], tuple[InferenceClient, str | None]]


async def run_arm(
    result: ArmResult,
    workload: Workload,
    urls: Sequence[str],
    dispatch: Dispatch,
    finish: Callable[[str | None, str], None],
    *,
    sample_s: float = 0.25,
) -> ArmResult:
    """Replay the workload; ``dispatch`` picks the client (and server id, if known) per turn,
    ``finish(server, request_id)`` is called when the request is answered or fails."""
    sp = workload.sampling()
    convs = workload.conversations()
    async with httpx.AsyncClient() as http:
        before = [await scrape(http, u) for u in urls]
        stop = asyncio.Event()
        t0 = time.monotonic()

        async def one(c: Conv) -> None:
            prompt = list(c.prompt)
            seen = 0
            for turn in range(workload.turns):
                rid = f"{result.name}-{c.trajectory_id}-t{turn}".replace(":", "_")
                client, server = dispatch(RouteRequest(rid, c.trajectory_id, c.group_id, prompt))
                t_send = time.monotonic()
                try:
                    res = await client.generate(GenerateRequest(rid, prompt, sp))
                finally:
                    finish(server, rid)
                t_done = time.monotonic()
                tm = res.timings
                result.records.append(RequestRecord(
                    c.trajectory_id, turn, server, res.prompt_tokens, res.cached_prompt_tokens,
                    seen, len(res.token_ids), t_send - t0, t_done - t0,
                    client_ttft(t_done - t_send, tm.decode_s), tm.queue_s, tm.first_token_s,
                ))
                seen = len(prompt) + len(res.token_ids)
                prompt = prompt + res.token_ids + list(c.observations[turn])
                await asyncio.sleep(c.pauses_s[turn])

        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(_sampler(http, urls, result, stop, sample_s, t0))
                async with asyncio.TaskGroup() as convs_tg:
                    for c in convs:
                        convs_tg.create_task(one(c))
                stop.set()
        except* Exception as eg:
            result.error = "; ".join(repr(e) for e in eg.exceptions)[:2000]
        result.wall_s = time.monotonic() - t0
        after = [await scrape(http, u) for u in urls]
    result.metrics_delta = [
        {k: a.get(k, 0.0) - b.get(k, 0.0) for k in a} for a, b in zip(after, before, strict=True)
    ]
    return result


def router_dispatch(
    router: Router, clients: Mapping[str, InferenceClient]
) -> tuple[Dispatch, Callable[[str | None, str], None]]:
    def dispatch(req: RouteRequest) -> tuple[InferenceClient, str | None]:
        server = router.route(req)
        return clients[server], server

    def finish(server: str | None, rid: str) -> None:
        if server is not None:
            router.on_finish(server, rid)

    return dispatch, finish


def fixed_dispatch(
    client: InferenceClient,
) -> tuple[Dispatch, Callable[[str | None, str], None]]:
    """Every request to one endpoint (a peer router), which decides the server itself."""

    def dispatch(req: RouteRequest) -> tuple[InferenceClient, str | None]:
        return client, None

    def finish(server: str | None, rid: str) -> None:
        return None

    return dispatch, finish
