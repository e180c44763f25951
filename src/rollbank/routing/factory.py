"""Build a router: ``make_router(policy, servers, clock, **cfg)`` builds any policy; ``cfg`` are
:class:`RouterConfig` fields (validated: an unknown or bad key is a
:class:`~rollbank.errors.ConfigError` naming it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollbank.clock import Clock
from rollbank.config import validate
from rollbank.routing.cache_aware import CacheAwareRouter
from rollbank.routing.config import RouterConfig
from rollbank.routing.policies import LeastLoadedRouter, RoundRobinRouter, StickyRouter
from rollbank.routing.router import Router, RouterPolicy


def router_from_config(config: RouterConfig, servers: Sequence[str], clock: Clock) -> Router:
    """Build the router a validated :class:`RouterConfig` describes."""
    match config.policy:
        case RouterPolicy.ROUND_ROBIN:
            return RoundRobinRouter(servers, clock)
        case RouterPolicy.LEAST_LOADED:
            return LeastLoadedRouter(servers, clock)
        case RouterPolicy.STICKY:
            return StickyRouter(servers, clock, max_sessions=config.max_sessions)
        case RouterPolicy.CACHE_AWARE:
            return CacheAwareRouter(servers, clock, config)


def make_router(
    policy: str | RouterPolicy, servers: Sequence[str], clock: Clock, **cfg: Any
) -> Router:
    """Build a router by policy name; ``cfg`` are :class:`RouterConfig` fields."""
    config = validate(RouterConfig, {"policy": policy, **cfg}, source="router config")
    return router_from_config(config, servers, clock)
