"""The Ray sandbox backend: ``SandboxBackend`` over one host actor per CPU node.

Owns :class:`RaySandboxBackend`: it joins the cluster (``sandbox.ray.address``), keeps one
:class:`~rollbank.sandbox.ray.host.NodeHost` actor on every live node that offers the
sandbox resource (``sandbox.ray.resource``), places sandboxes on them, and reports the
cluster's sandbox capacity (:meth:`RaySandboxBackend.watch`: the sum of the live nodes'
slots, which the collector hands to the scheduler as it changes).

Placement: a new sandbox goes to the live node with the most free slots (slots minus the
sandboxes placed there and not closed), ties to the node seen first. The siblings of one fork
are placed one by one the same way; a snapshot taken from a running sandbox
(``Sandbox.snapshot()``) lives on that sandbox's node and forks only there.

Invariants
- The warm state of a spec is made once per node: ``snapshot_spec`` makes it on every live
  node at once (set-up time, before the clock starts) and on a node that joins later at its
  first fork there; each host caches it by :func:`spec_key` (a content hash of the spec).
- Layers are host paths: every node must see them at the same path (one machine, or a shared
  filesystem for the build cache); a node that cannot fails the start with a sandbox error.
- A node that leaves (dead in Ray's node list, or its actor unreachable) is dropped at once:
  capacity falls, its sandboxes raise :class:`~rollbank.errors.SandboxLostError` (infra).
  A node that joins gets a host actor and adds its slots once the actor answers.
- ``aclose`` closes every sandbox, ends every host actor, stops the node monitor and shuts
  Ray down if this backend started it. No blocking Ray call runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any

from rollbank.errors import SandboxError, SandboxLostError, SandboxStartError
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.protocol import Sandbox, SandboxBackend, SandboxSpec, Snapshot
from rollbank.sandbox.ray.cluster import NodeRef, connect, ray_module, slots_by_node, spawn_host
from rollbank.sandbox.ray.config import RaySandboxConfig
from rollbank.sandbox.ray.sandbox import RaySandbox, RaySnapshot

log = logging.getLogger(__name__)

_HOST_READY_S = 120.0  # a new node's host actor must answer within this (worker start-up)


def spec_key(spec: SandboxSpec) -> str:
    """Content key of a spec (layers, workdir, env, limits, network, hostname, label)."""
    doc = {"layers": [str(p) for p in spec.layers], "workdir": spec.workdir,
           "env": sorted(spec.env.items()), "limits": repr(spec.limits),
           "network": spec.network, "hostname": spec.hostname, "label": spec.label}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


class RaySandboxBackend:
    """See module docstring. ``async with RaySandboxBackend(cfg, local) as backend: ...``"""

    def __init__(self, config: RaySandboxConfig, local: LocalSandboxConfig | None = None) -> None:
        if config.address is None:
            raise SandboxError("the Ray backend needs sandbox.ray.address ('auto' or HOST:PORT)")
        self.config = config
        self.local = local or LocalSandboxConfig()
        self.nodes: dict[str, NodeRef] = {}  # live nodes with a ready host actor
        self.infos: dict[str, dict[str, Any]] = {}  # node id -> its host's info()
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._sandboxes: set[RaySandbox] = set()
        self._snapshots: list[RaySnapshot] = []
        self._watchers: set[asyncio.Event] = set()
        self._monitor: asyncio.Task[None] | None = None
        self._owns_ray = False
        self._spawned = 0
        self._closed = False

    # ---------------------------------------------------------------- lifetime
    async def open(self) -> RaySandboxBackend:
        """Join the cluster and wait (``wait_for_nodes_s``) for a first node with slots."""
        try:
            self._owns_ray = await asyncio.to_thread(connect, self.config)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise SandboxStartError(f"cannot join the Ray cluster at "
                                    f"{self.config.address!r}: {exc}") from exc
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.wait_for_nodes_s
        while True:
            await self.refresh()
            if self._starting:
                await asyncio.wait(list(self._starting.values()), timeout=_HOST_READY_S)
            if self.nodes:
                break
            if loop.time() >= deadline:
                raise SandboxStartError(
                    f"no live Ray node offers the resource {self.config.resource!r} "
                    f"(waited {self.config.wait_for_nodes_s:.0f} s)")
            await asyncio.sleep(min(self.config.node_poll_s, 1.0))
        self._monitor = asyncio.create_task(self._follow_nodes(), name="rollbank-ray-nodes")
        return self

    async def __aenter__(self) -> RaySandboxBackend:
        return await self.open()

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = [t for t in (self._monitor, *self._starting.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        nodes = list(self.nodes.values())
        await asyncio.gather(*(n.call("aclose") for n in nodes), return_exceptions=True)
        for n in nodes:
            n.kill()
        self.nodes.clear()
        self._sandboxes.clear()
        for ev in self._watchers:
            ev.set()
        if self._owns_ray:
            await asyncio.to_thread(ray_module().shutdown)

    # ---------------------------------------------------------------- nodes and capacity
    @property
    def capacity(self) -> int:
        """Sandbox slots of the live nodes (capped by ``max_slots``)."""
        total = sum(n.slots for n in self.nodes.values())
        return total if self.config.max_slots is None else min(total, self.config.max_slots)

    async def watch(self) -> AsyncIterator[int]:
        """The current capacity, then each new value when nodes join or leave."""
        ev = asyncio.Event()
        self._watchers.add(ev)
        try:
            last = -1
            while not self._closed:
                cap = self.capacity
                if cap != last:
                    last = cap
                    yield cap
                await ev.wait()
                ev.clear()
        finally:
            self._watchers.discard(ev)

    def _notify(self) -> None:
        for ev in self._watchers:
            ev.set()

    async def refresh(self) -> None:
        """Read Ray's node list once: start hosts on new nodes, drop the ones gone."""
        raw = await asyncio.to_thread(ray_module().nodes)
        wanted = slots_by_node(raw, self.config.resource, self.config.slots_per_node)
        for node_id, ref in list(self.nodes.items()):
            if node_id not in wanted:
                ref.mark_lost()  # -> _on_lost
            elif ref.slots != wanted[node_id]:
                ref.slots = wanted[node_id]
                self._notify()
        for node_id, slots in wanted.items():
            if node_id not in self.nodes and node_id not in self._starting and not self._closed:
                self._starting[node_id] = asyncio.create_task(self._start_host(node_id, slots))

    async def _start_host(self, node_id: str, slots: int) -> None:
        self._spawned += 1
        actor = spawn_host(self.config, self.local, node_id, self._spawned)
        ref = NodeRef(node_id, actor, slots, self._on_lost)
        try:
            info = await asyncio.wait_for(ref.call("info"), _HOST_READY_S)
        except (SandboxError, TimeoutError) as exc:
            log.warning("sandbox host on node %s did not start: %s", node_id[:8], exc)
            ref.kill()
            return
        finally:
            self._starting.pop(node_id, None)
        if self._closed:
            ref.kill()
            return
        self.infos[node_id] = dict(info)
        self.nodes[node_id] = ref
        self._notify()

    def _on_lost(self, node_id: str) -> None:
        ref = self.nodes.pop(node_id, None)
        if ref is not None:
            log.warning("sandbox node %s lost: %d sandbox(es) on it", node_id[:8], ref.running)
            ref.kill()
            for snap in self._snapshots:
                snap.per_node.pop(node_id, None)
            self._notify()

    async def _follow_nodes(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.config.node_poll_s)
            try:
                await self.refresh()
            except Exception as exc:  # the GCS briefly unreachable: try again next period
                log.warning("reading the Ray node list failed: %s: %s", type(exc).__name__, exc)

    def _pick(self) -> NodeRef:
        live = [n for n in self.nodes.values() if not n.lost]
        if not live:
            raise SandboxLostError("no live Ray node offers sandbox slots")
        return max(live, key=lambda n: n.slots - n.running)

    def _forget(self, sb: RaySandbox) -> None:
        if sb in self._sandboxes:
            self._sandboxes.discard(sb)
            sb.node.running -= 1

    def _adopt(self, node: NodeRef, local_id: str) -> RaySandbox:
        sb = RaySandbox(node, local_id, self._forget)
        self._sandboxes.add(sb)
        node.running += 1
        return sb

    # ---------------------------------------------------------------- protocol
    async def start(self, spec: SandboxSpec, *, budget_s: float | None = None) -> Sandbox:
        node = self._pick()
        node.running += 1  # reserved while the start is in flight
        try:
            local_id: str = await node.call("start", spec, budget_s)
        finally:
            node.running -= 1
        return self._adopt(node, local_id)

    async def snapshot_spec(self, spec: SandboxSpec) -> Snapshot:
        snap = RaySnapshot("r" + uuid.uuid4().hex[:12], spec_key(spec), spec)
        self._snapshots.append(snap)
        nodes = list(self.nodes.values())
        results = await asyncio.gather(*(self._on_node(snap, n) for n in nodes),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors and len(errors) == len(nodes):
            raise errors[0]
        return snap

    async def _on_node(self, snap: RaySnapshot, node: NodeRef) -> str:
        """The node's snapshot id for ``snap`` (made there on first use)."""
        have = snap.per_node.get(node.node_id)
        if have is not None:
            return have
        if snap.spec is None:
            raise SandboxLostError(f"snapshot {snap.snapshot_id} was on a lost node")
        lock = snap.locks.setdefault(node.node_id, asyncio.Lock())
        async with lock:
            if node.node_id not in snap.per_node:
                snap.per_node[node.node_id] = await node.call("snapshot_spec", snap.key, snap.spec)
            return snap.per_node[node.node_id]

    async def fork(self, snapshot: Snapshot, n: int, *, budget_s: float | None = None
                   ) -> list[Sandbox]:
        if not isinstance(snapshot, RaySnapshot):
            raise SandboxError(f"not a Ray snapshot: {snapshot!r}")
        if snapshot.node_bound:
            (node_id,) = snapshot.per_node or ("",)
            node = self.nodes.get(node_id)
            if node is None:
                raise SandboxLostError(f"snapshot {snapshot.snapshot_id} was on a lost node")
            plan = {node_id: n}
            node.running += n
        else:
            plan = {}
            for _ in range(n):
                node = self._pick()
                node.running += 1
                plan[node.node_id] = plan.get(node.node_id, 0) + 1
        placed = {node_id: self.nodes[node_id] for node_id in plan}
        out: list[Sandbox] = []
        try:
            results = await asyncio.gather(
                *(self._fork_on(snapshot, placed[i], k, budget_s, out) for i, k in plan.items()),
                return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]
        except BaseException:
            for sb in out:
                with contextlib.suppress(Exception):
                    await sb.close()
            raise
        return out

    async def _fork_on(self, snapshot: RaySnapshot, node: NodeRef, k: int,
                       budget_s: float | None, out: list[Sandbox]) -> None:
        try:  # ``k`` slots of the node were reserved by the caller until adopted
            snap_id = await self._on_node(snapshot, node)
            ids: list[str] = await node.call("fork", snap_id, k, budget_s)
        finally:
            node.running -= k
        out.extend(self._adopt(node, i) for i in ids)

    @property
    def sandboxes(self) -> Sequence[RaySandbox]:
        return list(self._sandboxes)


def _conforms(b: RaySandboxBackend) -> SandboxBackend:
    return b  # mypy checks RaySandboxBackend against the protocol here
