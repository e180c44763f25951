"""The router seam: which inference server gets a request.

A :class:`Router` is a pure policy. It sees events (a request to place, a request that finished
or was aborted, a server that flushed its cache or changed weights) and answers with a server
id; it never does I/O and reads time only from an injected :class:`~rollbank.clock.Clock`.
Asyncio drivers (the episode runner, ``rollbank bench routing``) call it around real requests.

Invariants every policy keeps
- ``route`` returns one of the server ids given at construction or added since
  (``on_server_ready``: a server that started later joins the targets), and counts the request as
  in flight on that server until ``on_finish`` or ``on_abort`` names it (unknown or repeated
  request ids are ignored, so a late or duplicate event cannot drive a load negative).
- ``route`` is deterministic given the construction arguments, the event sequence and the
  clock readings (no hidden randomness), so a replay or a simulation makes the same choices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class RouterPolicy(StrEnum):
    """The routing policies rollbank implements."""

    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"
    STICKY = "sticky"
    CACHE_AWARE = "cache_aware"


@dataclass(frozen=True)
class RouteRequest:
    """One generation request to place.

    ``trajectory_id`` names the conversation (one episode); ``group_id`` its GRPO group, whose
    siblings share the initial prompt. ``prompt_token_ids`` is the full prompt of this turn.
    """

    request_id: str
    trajectory_id: str
    group_id: str
    prompt_token_ids: Sequence[int]


class Router(Protocol):
    """A pure routing policy over a fixed set of server ids."""

    @property
    def servers(self) -> tuple[str, ...]: ...

    def route(self, req: RouteRequest) -> str:
        """Choose a server for ``req`` and count it as in flight there."""
        ...

    def on_finish(self, server: str, request_id: str) -> None:
        """The request completed (successfully or with an error answer)."""
        ...

    def on_abort(self, server: str, request_id: str) -> None:
        """The request was aborted or failed in transport; it no longer occupies the server."""
        ...

    def on_cache_reset(self, server: str) -> None:
        """The server dropped its prefix cache: forget what we believed it held."""
        ...

    def on_weight_version(self, server: str, version: int) -> None:
        """The server now serves weights ``version``; a change invalidates cached prefixes."""
        ...

    def on_server_ready(self, server: str) -> None:
        """A server started after the others is serving: it becomes a target (no load, no
        cached prefixes). A server already known is ignored."""
        ...

    def in_flight(self) -> Mapping[str, int]:
        """Requests currently counted in flight per server."""
        ...


class LoadTracker:
    """In-flight accounting shared by every policy: +1 on route, -1 on finish or abort."""

    def __init__(self, servers: Sequence[str]) -> None:
        if not servers:
            raise ValueError("a router needs at least one server")
        if len(set(servers)) != len(servers):
            raise ValueError(f"duplicate server ids: {list(servers)}")
        self.servers: tuple[str, ...] = tuple(servers)
        self._load: dict[str, int] = dict.fromkeys(self.servers, 0)
        self._where: dict[str, str] = {}  # request id -> server

    def add_server(self, server: str) -> bool:
        """Make ``server`` a target with no load; False if it already was one."""
        if server in self._load:
            return False
        self.servers = (*self.servers, server)
        self._load[server] = 0
        return True

    def check(self, server: str) -> None:
        if server not in self._load:
            raise KeyError(f"unknown server {server!r}; known: {list(self.servers)}")

    def add(self, server: str, request_id: str) -> None:
        self.check(server)
        previous = self._where.get(request_id)
        if previous is not None:  # a request id reused while in flight: move it
            self._load[previous] -= 1
        self._where[request_id] = server
        self._load[server] += 1

    def remove(self, server: str, request_id: str) -> bool:
        """Forget a request; False (and ignored) if unknown or in flight elsewhere."""
        if self._where.get(request_id) != server:
            return False
        del self._where[request_id]
        self._load[server] -= 1
        return True

    def load(self, server: str) -> int:
        return self._load[server]

    def snapshot(self) -> dict[str, int]:
        return dict(self._load)

    def least_loaded(self, candidates: Sequence[str] | None = None, *, start: int = 0) -> str:
        """The least-loaded server; ties go to the first at or after index ``start``."""
        pool = self.servers if candidates is None else tuple(candidates)
        n = len(pool)
        best = pool[start % n]
        for k in range(1, n):
            s = pool[(start + k) % n]
            if self._load[s] < self._load[best]:
                best = s
        return best
