"""Cache-aware routing: send a request where its prompt's prefix is cached, within load bounds.

The policy, per request (all state is routing history; no I/O, time from the injected clock):

1. Hash the prompt into chained token blocks (:mod:`rollbank.routing.blocks`; per
   trajectory, extended from its last prompt: only a turn's new blocks are hashed) and find,
   for every server, how many leading blocks it is believed to hold (once per route). If the
   best server holds at least ``cache_threshold`` of the prompt's blocks, it is preferred
   (``prefix``). For the first request of a new GRPO group (trajectory and group never
   seen) the bar is ``new_group_cache_threshold``: a shared few-shot header must not pull
   every new group onto the server that saw it first; new groups spread by load instead.
2. Otherwise the server of the trajectory's previous turn is preferred (``trajectory``), else
   the server of a sibling in the same GRPO group (``group``: siblings share the prompt), else
   none: the least-loaded server takes it (``load``; equal loads go to the longest match).
3. The preference is overridden only under real imbalance: the preferred server's load is more
   than ``balance_abs_threshold`` above the least-loaded server's AND more than
   ``balance_rel_threshold`` times it (``imbalance``).

Load is *sessions*, not only requests in flight: a server's load is its in-flight requests
plus its parked conversations — trajectories whose last request there finished less than
``session_idle_s`` ago and that have not sent the next one (they are in a tool call and will
come back to it). Measured reason (``rollbank bench routing --engine accel-sim``, timelines):
every affinity break under the in-flight-only signal happened while the servers held equal
conversations (32/32/32/32) and one server's were all in tool calls at once (in flight 30 vs
2); each break re-prefilled a whole context and lowered the hit rate, and the "idle" server
was loaded again a second later. ``session_idle_s = 0`` restores the in-flight-only signal.
4. The chosen server is credited with the prompt's blocks (LRU, aged out after
   ``eviction_s``) and becomes the trajectory's and group's server.

Invariants
- In-flight load is real: +1 on route, -1 on finish/abort of a known request id. A finish
  parks the request's trajectory on its server (an abort does not: the episode may be over);
  the trajectory's next route, or ``session_idle_s`` without one, unparks it.
- A cache reset, or a weight version change, on a server forgets every block and affinity
  believed for that server (its KV is gone or stale); loads are untouched.
- Ties (equal match, equal load) are broken by a rotating start index, never randomly.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from enum import StrEnum

from rollbank.clock import Clock
from rollbank.routing.blocks import BlockIndex, SessionHashes, block_hashes
from rollbank.routing.config import RouterConfig
from rollbank.routing.policies import LruMap
from rollbank.routing.router import LoadTracker, RouteRequest


class RouteReason(StrEnum):
    """Why the cache-aware router chose a server (counted in :meth:`CacheAwareRouter.stats`)."""

    PREFIX = "prefix"
    TRAJECTORY = "trajectory"
    GROUP = "group"
    LOAD = "load"
    IMBALANCE = "imbalance"


class CacheAwareRouter:
    """Prefix affinity on token-block hashes, bounded by real in-flight imbalance."""

    def __init__(self, servers: Sequence[str], clock: Clock, config: RouterConfig) -> None:
        self._loads = LoadTracker(servers)
        self._clock = clock
        self.config = config
        self._index = {
            s: BlockIndex(max_blocks=config.max_blocks_per_server, max_age_s=config.eviction_s)
            for s in self._loads.servers
        }
        self._hashes = SessionHashes(config.block_size, max_sessions=config.max_sessions,
                                     max_tokens=config.hash_memo_tokens)
        self._trajectory = LruMap(config.max_sessions)
        self._group = LruMap(config.max_sessions)
        self._versions: dict[str, int] = {}
        self._request_traj: dict[str, str] = {}  # in-flight request id -> trajectory id
        # per server: parked trajectory id -> when its last request finished (oldest first)
        self._parked: dict[str, OrderedDict[str, float]] = {
            s: OrderedDict() for s in self._loads.servers
        }
        self._parked_at: dict[str, str] = {}  # parked trajectory id -> server
        self._tie = 0
        self._reasons: Counter[RouteReason] = Counter()
        self.last_reason: RouteReason | None = None

    # ------------------------------------------------------------------ Router protocol
    @property
    def servers(self) -> tuple[str, ...]:
        return self._loads.servers

    def route(self, req: RouteRequest) -> str:
        now = self._clock.now()
        for idx in self._index.values():
            idx.expire(now)
        self._expire_parked(now)
        self._unpark(req.trajectory_id)
        hashes = self._hashes.hashes(req.trajectory_id, req.prompt_token_ids)
        matches = {s: idx.match(hashes) for s, idx in self._index.items()}
        preferred, reason = self._preference(req, hashes, matches)
        least = self._least_loaded(matches)
        self._tie += 1
        if preferred is None:
            server, reason = least, RouteReason.LOAD
        elif self._imbalanced(preferred, least):
            server, reason = least, RouteReason.IMBALANCE
        else:
            server = preferred
        self._index[server].touch(hashes, now)
        self._trajectory.put(req.trajectory_id, server)
        self._group.put(req.group_id, server)
        self._loads.add(server, req.request_id)
        self._request_traj[req.request_id] = req.trajectory_id
        self._reasons[reason] += 1
        self.last_reason = reason
        return server

    def on_finish(self, server: str, request_id: str) -> None:
        if not self._loads.remove(server, request_id):
            return
        traj = self._request_traj.pop(request_id, None)
        if traj is not None and self.config.session_idle_s > 0:
            self._unpark(traj)
            self._parked[server][traj] = self._clock.now()
            self._parked_at[traj] = server

    def on_abort(self, server: str, request_id: str) -> None:
        if self._loads.remove(server, request_id):
            self._request_traj.pop(request_id, None)

    def on_cache_reset(self, server: str) -> None:
        self._loads.check(server)
        self._index[server].clear()
        self._trajectory.drop_server(server)
        self._group.drop_server(server)

    def on_weight_version(self, server: str, version: int) -> None:
        self._loads.check(server)
        previous = self._versions.get(server)
        self._versions[server] = version
        if previous is not None and previous != version:
            self.on_cache_reset(server)

    def on_server_ready(self, server: str) -> None:
        if self._loads.add_server(server):
            self._index[server] = BlockIndex(max_blocks=self.config.max_blocks_per_server,
                                             max_age_s=self.config.eviction_s)
            self._parked[server] = OrderedDict()

    def in_flight(self) -> Mapping[str, int]:
        return self._loads.snapshot()

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict[str, int]:
        """How many routes each reason decided, plus believed blocks per server."""
        out = {f"reason_{r.value}": self._reasons[r] for r in RouteReason}
        for s, idx in self._index.items():
            out[f"blocks[{s}]"] = len(idx)
        return out

    def session_load(self) -> dict[str, int]:
        """The load the policy balances: in flight + parked conversations, per server (as of
        the last event; parked sessions past ``session_idle_s`` expire at the next route)."""
        return {s: self._load(s) for s in self.servers}

    def believed_match(self, server: str, prompt_token_ids: Sequence[int]) -> int:
        """Leading blocks of this prompt the router believes ``server`` holds."""
        hashes = block_hashes(prompt_token_ids, self.config.block_size)
        return self._index[server].match(hashes)

    # ------------------------------------------------------------------ internals
    def _load(self, server: str) -> int:
        return self._loads.load(server) + len(self._parked[server])

    def _unpark(self, trajectory_id: str) -> None:
        server = self._parked_at.pop(trajectory_id, None)
        if server is not None:
            del self._parked[server][trajectory_id]

    def _expire_parked(self, now: float) -> None:
        limit = now - self.config.session_idle_s
        for parked in self._parked.values():
            while parked:
                traj, t = next(iter(parked.items()))
                if t > limit:
                    break
                del parked[traj]
                del self._parked_at[traj]

    def _preference(
        self, req: RouteRequest, hashes: list[int], matches: Mapping[str, int]
    ) -> tuple[str | None, RouteReason]:
        pinned = self._trajectory.get(req.trajectory_id)
        sibling = self._group.get(req.group_id)
        known = pinned is not None or sibling is not None
        threshold = self.config.cache_threshold if known else self.config.new_group_cache_threshold
        if hashes:
            best: str | None = None
            best_match = 0
            n = len(self.servers)
            for k in range(n):
                s = self.servers[(self._tie + k) % n]
                m = matches[s]
                better = m > best_match or (
                    m == best_match and best is not None
                    and self._load(s) < self._load(best)
                )
                if m > 0 and better:
                    best, best_match = s, m
            if best is not None and best_match / len(hashes) >= threshold:
                return best, RouteReason.PREFIX
        if pinned is not None:
            return pinned, RouteReason.TRAJECTORY
        if sibling is not None:
            return sibling, RouteReason.GROUP
        return None, RouteReason.LOAD

    def _least_loaded(self, matches: Mapping[str, int]) -> str:
        """The least-loaded server (sessions); among equals the longest match, then rotation."""
        n = len(self.servers)
        best = self.servers[self._tie % n]
        best_key = (self._load(best), -matches[best])
        for k in range(1, n):
            s = self.servers[(self._tie + k) % n]
            key = (self._load(s), -matches[s])
            if key < best_key:
                best, best_key = s, key
        return best

    def _imbalanced(self, preferred: str, least: str) -> bool:
        hi = self._load(preferred)
        lo = self._load(least)
        return (
            hi - lo > self.config.balance_abs_threshold
            and hi > self.config.balance_rel_threshold * lo
        )
