"""The simple routing policies: round-robin, least-loaded, sticky per trajectory.

They are baselines for the cache-aware policy (:mod:`rollbank.routing.cache_aware`) and share
its in-flight accounting (:class:`~rollbank.routing.router.LoadTracker`). None of them keeps
any belief about server caches, so cache resets and weight versions are no-ops for the first
two; sticky forgets the trajectories pinned to a server that flushed (re-pinning is then free).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from rollbank.clock import Clock
from rollbank.routing.router import LoadTracker, RouteRequest


class LruMap:
    """A bounded key -> server map; least recently used entries go first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._d: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
        return v

    def put(self, key: str, server: str) -> None:
        self._d[key] = server
        self._d.move_to_end(key)
        while len(self._d) > self.capacity:
            self._d.popitem(last=False)

    def drop_server(self, server: str) -> None:
        for k in [k for k, v in self._d.items() if v == server]:
            del self._d[k]

    def __len__(self) -> int:
        return len(self._d)


class _Base:
    def __init__(self, servers: Sequence[str], clock: Clock) -> None:
        self._loads = LoadTracker(servers)
        self._clock = clock

    @property
    def servers(self) -> tuple[str, ...]:
        return self._loads.servers

    def on_finish(self, server: str, request_id: str) -> None:
        self._loads.remove(server, request_id)

    def on_abort(self, server: str, request_id: str) -> None:
        self._loads.remove(server, request_id)

    def on_cache_reset(self, server: str) -> None:
        self._loads.check(server)

    def on_weight_version(self, server: str, version: int) -> None:
        self._loads.check(server)

    def on_server_ready(self, server: str) -> None:
        self._loads.add_server(server)

    def in_flight(self) -> Mapping[str, int]:
        return self._loads.snapshot()


class RoundRobinRouter(_Base):
    """Each request to the next server in turn, whatever it is."""

    def __init__(self, servers: Sequence[str], clock: Clock) -> None:
        super().__init__(servers, clock)
        self._next = 0

    def route(self, req: RouteRequest) -> str:
        server = self.servers[self._next % len(self.servers)]
        self._next += 1
        self._loads.add(server, req.request_id)
        return server


class LeastLoadedRouter(_Base):
    """The server with the fewest requests in flight (ties rotate, so idle servers alternate)."""

    def __init__(self, servers: Sequence[str], clock: Clock) -> None:
        super().__init__(servers, clock)
        self._tie = 0

    def route(self, req: RouteRequest) -> str:
        server = self._loads.least_loaded(start=self._tie)
        self._tie += 1
        self._loads.add(server, req.request_id)
        return server


class StickyRouter(_Base):
    """Every turn of a trajectory to the server of its first turn (least-loaded at that time).

    Plain stickiness, as verl does it but with real in-flight load: it never breaks a pin for
    imbalance, and siblings of a group are placed independently.
    """

    def __init__(self, servers: Sequence[str], clock: Clock, *, max_sessions: int) -> None:
        super().__init__(servers, clock)
        self._pins = LruMap(max_sessions)
        self._tie = 0

    def route(self, req: RouteRequest) -> str:
        server = self._pins.get(req.trajectory_id)
        if server is None:
            server = self._loads.least_loaded(start=self._tie)
            self._tie += 1
            self._pins.put(req.trajectory_id, server)
        self._loads.add(server, req.request_id)
        return server

    def on_cache_reset(self, server: str) -> None:
        self._loads.check(server)
        self._pins.drop_server(server)

    def on_weight_version(self, server: str, version: int) -> None:
        # Weight updates are rolled over every server together; pins stay valid in balance.
        self._loads.check(server)
