"""The cluster side of the Ray backend: which nodes offer sandbox slots, their host actors.

Owns :func:`slots_by_node` (pure: Ray's node list -> live nodes and their slots),
:func:`connect` (join the cluster the config names), :func:`spawn_host` (one
:class:`~rollbank.sandbox.ray.host.NodeHost` actor pinned to a node) and :class:`NodeRef`
(a node's host actor as the driver sees it: awaited calls, errors translated).

Invariants
- ray is imported lazily (``rollbank.extras.require``): nothing here runs without the extra.
- A host actor is pinned to its node (hard node affinity, no restarts): when the node dies the
  actor dies with its sandboxes, and every call to it raises
  :class:`~rollbank.errors.SandboxLostError` (infra, never the model's); the node is then
  reported lost once (``on_lost``).
- Errors raised inside the actor that are rollbank's own (``SandboxError``...) reach the
  caller as themselves, not wrapped in Ray's exception.
- Calls are awaited ObjectRefs: nothing blocks the event loop.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from rollbank.errors import RollbankError, SandboxError, SandboxLostError
from rollbank.extras import require
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.ray.config import RaySandboxConfig

FEATURE = "the Ray sandbox backend (sandbox.ray.address, collect --ray)"


def ray_module() -> ModuleType:
    return require("ray", "ray", FEATURE)


def slots_by_node(nodes: Sequence[Mapping[str, Any]], resource: str,
                  slots_per_node: int | None) -> dict[str, int]:
    """Live nodes offering ``resource`` -> their sandbox slots (``slots_per_node`` or the
    node's amount of the resource, rounded down; nodes with 0 slots are left out)."""
    out: dict[str, int] = {}
    for node in nodes:
        if not node.get("Alive", False):
            continue
        amount = float((node.get("Resources") or {}).get(resource, 0.0))
        if amount <= 0:
            continue
        slots = slots_per_node if slots_per_node is not None else math.floor(amount + 1e-9)
        if slots > 0:
            out[str(node["NodeID"])] = slots
    return out


def connect(cfg: RaySandboxConfig) -> bool:
    """Join the cluster ``cfg.address`` names (blocking: run it off the event loop). Returns
    True when this call initialised Ray (the caller then shuts it down)."""
    ray = ray_module()
    if ray.is_initialized():
        return False
    runtime_env: dict[str, Any] = {}
    if cfg.ship_package:
        import rollbank

        runtime_env["py_modules"] = [str(Path(rollbank.__file__).parent)]
    ray.init(address=cfg.address, namespace=cfg.namespace, runtime_env=runtime_env or None,
             log_to_driver=False, logging_level="WARNING")
    return True


def spawn_host(cfg: RaySandboxConfig, local: LocalSandboxConfig, node_id: str,
               serial: int) -> Any:
    """A :class:`NodeHost` actor on ``node_id`` (it uses no CPU or slot resource itself: the
    scheduler, not Ray, bounds the sandboxes running at once)."""
    ray = ray_module()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from rollbank.sandbox.ray.host import NodeHost

    actor_cls = ray.remote(NodeHost)
    return actor_cls.options(
        num_cpus=0, max_restarts=0, max_concurrency=cfg.actor_concurrency,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        name=f"rollbank-sandbox-host-{node_id[:12]}-{os.getpid()}-{serial}", namespace=cfg.namespace,
    ).remote(local, node_id)


def _lost_types(ray: ModuleType) -> tuple[type[BaseException], ...]:
    e = ray.exceptions
    return (e.RayActorError, e.NodeDiedError, e.WorkerCrashedError, e.ObjectLostError,
            e.LocalRayletDiedError, e.ActorUnschedulableError)


class NodeRef:
    """One node's host actor (see module docstring). ``running`` counts the sandboxes the
    driver placed there and has not closed (placement reads it)."""

    def __init__(self, node_id: str, actor: Any, slots: int,
                 on_lost: Callable[[str], None]) -> None:
        self.node_id = node_id
        self.actor = actor
        self.slots = slots
        self.running = 0
        self.lost = False
        self._on_lost = on_lost
        self._ray = ray_module()
        self._lost_types = _lost_types(self._ray)

    @property
    def short(self) -> str:
        return self.node_id[:8]

    async def call(self, method: str, *args: Any) -> Any:
        """``await actor.method.remote(*args)`` with errors translated (module docstring)."""
        if self.lost:
            raise SandboxLostError(f"node {self.short} was lost")
        try:
            return await getattr(self.actor, method).remote(*args)
        except self._lost_types as exc:
            self.mark_lost()
            raise SandboxLostError(
                f"node {self.short} lost during {method}: {type(exc).__name__}") from None
        except self._ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, RollbankError):
                raise cause from None
            raise SandboxError(f"sandbox host on node {self.short} failed in {method}: "
                               f"{type(cause).__name__}: {cause}") from None

    def mark_lost(self) -> None:
        if not self.lost:
            self.lost = True
            self._on_lost(self.node_id)

    def kill(self) -> None:
        """End the actor (its sandboxes die with it); non-blocking."""
        with contextlib.suppress(Exception):  # already gone with its node
            self._ray.kill(self.actor, no_restart=True)
