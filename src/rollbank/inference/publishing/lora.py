"""LoRA pattern: a new adapter name per version (the compact update for adapter training).

Loading the adapter (``/v1/load_lora_adapter`` as ``<prefix>-v<version>``) happens on every
server *before* generation is paused: requests on the previous adapter keep running. A
failed load unloads the new adapter where it did load and raises, nothing paused. Then the
short pause names the version on each engine (so per-token versions stay the engine's) and
switches :attr:`LoraPublisher.adapter`, the name requests must carry from then on. Adapters
older than the previous one are unloaded afterwards. The prefix cache is not reset: vLLM's
block hashes include the adapter's name and path, and the base weights never change, so no
request can reuse a block of another version. With the ``abort`` plan the engines are not
paused at all (their weights do not change): admission closes, each client aborts every
request it has in flight until all answered, the version is named and the clients switched,
admission reopens (``Fleet.abort_only``; clients without ``inflight_ids``: pause + resume).

In-flight plan ``pause`` (keep) is refused: a kept request would go on with the old adapter
while the engine tags its tokens with the new version. ``finish`` and ``abort`` are exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

from rollbank.clock import Clock, MonotonicClock
from rollbank.errors import ConfigError, PublicationError
from rollbank.inference.protocol import AdmissionGate
from rollbank.inference.publishing.fleet import Fleet, FleetClient, Step
from rollbank.inference.publishing.protocol import (
    InflightPlan,
    Pattern,
    PublicationRecord,
    WeightUpdate,
)
from rollbank.inference.publishing.state import read_safetensors_meta, validate


def adapter_name(version: int, prefix: str = "policy") -> str:
    """The adapter name version ``version`` is published under."""
    return f"{prefix}-v{version}"


class LoraClient(FleetClient, Protocol):
    async def load_lora(self, name: str, path: str) -> None: ...

    async def unload_lora(self, name: str) -> None: ...

    async def set_weight_version(self, version: int) -> None: ...


class LoraPublisher:
    """Publishes PEFT adapter directories as new adapters on every server."""

    def __init__(
        self,
        clients: Sequence[LoraClient],
        *,
        prefix: str = "policy",
        max_rank: int | None = None,
        plan: InflightPlan = "finish",
        version: int = 0,
        adapter: str | None = None,
        gate: AdmissionGate | None = None,
        clock: Clock | None = None,
        on_published: Callable[[str, str, int], None] | None = None,
        route: Callable[[FleetClient, str | None], None] | None = None,
    ) -> None:
        if plan == "pause":
            raise ConfigError("the lora pattern cannot keep in-flight requests across an adapter "
                              "switch (they would keep the old adapter); use finish or abort")
        self.clients = list(clients)
        self.prefix = prefix
        self.max_rank = max_rank
        self.clock = clock or MonotonicClock()
        # no prefix-cache reset: vLLM's block hashes cover the adapter (name and path), and
        # each version is a new adapter, so no request can hit an older version's blocks
        # plan abort: the old adapter's requests are aborted, the engines are not paused (the
        # running weights do not change), when every client can abort what it has in flight
        abort_only = plan == "abort" and all(hasattr(c, "inflight_ids") for c in self.clients)
        self.fleet = Fleet(self.clients, plan=plan, gate=gate, clock=self.clock, reset_cache=False,
                           abort_only=abort_only)
        self._version = version
        self.adapter = adapter  # name requests carry; None = base weights
        self.loaded: list[str] = [adapter] if adapter else []
        self.reference: dict[str, tuple[tuple[int, ...], str]] | None = None
        self.on_published = on_published  # (adapter name, path, version)
        # route(client, adapter): make the client send its requests to ``adapter`` (None: base
        # weights); called in the paused step that names the version, so no request sent after
        # the resume reaches the old adapter under the new version
        self.route = route
        self.records: list[PublicationRecord] = []

    @property
    def pattern(self) -> Pattern:
        return "lora"

    @property
    def wants_tensors(self) -> bool:
        return False

    @property
    def version(self) -> int:
        return self._version

    def name_of(self, version: int) -> str:
        return adapter_name(version, self.prefix)

    def _serving(self) -> dict[str, int]:
        return {c.base_url: self._version for c in self.clients}

    def _check(self, path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
        try:
            cfg = json.loads((path / "adapter_config.json").read_text())
            meta = read_safetensors_meta(path)
        except (OSError, ValueError) as exc:
            raise PublicationError(f"not a PEFT adapter directory {path}: {exc}",
                                   serving=self._serving()) from exc
        if self.max_rank is not None and int(cfg.get("r", 0)) > self.max_rank:
            raise PublicationError(f"adapter rank {cfg.get('r')} > server max {self.max_rank}",
                                   serving=self._serving())
        if self.reference is not None:
            validate(((n, s) for n, (s, _) in meta.items()), self.reference, serving=self._serving())
        return meta

    def _label(self, version: int, adapter: str | None) -> Step:
        by_url = {c.base_url: c for c in self.clients}

        async def step(fc: FleetClient) -> None:
            await by_url[fc.base_url].set_weight_version(version)
            if self.route is not None:
                self.route(fc, adapter)

        return step

    async def publish(
        self, update: WeightUpdate, *, version: int, ready_at: float | None = None
    ) -> PublicationRecord:
        ready = self.clock.now() if ready_at is None else ready_at
        if not update.lora or update.path is None:
            raise PublicationError("the lora pattern publishes adapter directories",
                                   serving=self._serving())
        path = Path(update.path)
        meta = await asyncio.to_thread(self._check, path)
        name = self.name_of(version)
        t0 = self.clock.now()
        results = await asyncio.gather(*(c.load_lora(name, str(path)) for c in self.clients),
                                       return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            for c, r in zip(self.clients, results, strict=True):
                if not isinstance(r, BaseException):
                    with contextlib.suppress(Exception):
                        await c.unload_lora(name)
            raise PublicationError(f"adapter {name} failed to load ({failed[0]!r}); engines "
                                   f"keep version {self._version}", serving=self._serving()) from failed[0]
        steps = {"load_s": self.clock.now() - t0}
        nbytes = await asyncio.to_thread(_size, path)
        try:
            record = await self.fleet.publish(
                pattern="lora", version=version, previous_version=self._version, ready_at=ready,
                apply=self._label(version, name), rollback=self._label(self._version, self.adapter),
                steps=steps, tensors=len(meta), nbytes=nbytes,
            )  # fmt: skip
        except PublicationError:
            await asyncio.gather(*(c.unload_lora(name) for c in self.clients), return_exceptions=True)
            raise
        self.reference = self.reference or meta
        self.adapter = name
        self._version = version
        self.loaded.append(name)
        while len(self.loaded) > 2:
            old = self.loaded.pop(0)
            await asyncio.gather(*(c.unload_lora(old) for c in self.clients), return_exceptions=True)
        self.records.append(record)
        if self.on_published is not None:
            self.on_published(name, str(path), version)
        return record

    async def aclose(self) -> None:
        return None


def routed_lora_publisher(clients: Sequence[object], *, plan: InflightPlan,
                          gate: AdmissionGate | None, max_rank: int | None,
                          field: str) -> LoraPublisher:
    """A :class:`LoraPublisher` that switches each client's requests to the new adapter (its
    ``model``) inside the paused step naming the version. Every client must load adapters and
    name the model its requests go to; otherwise a :class:`ConfigError` on ``field``."""
    for c in clients:
        if not (callable(getattr(c, "load_lora", None)) and hasattr(c, "model")):
            raise ConfigError(f"the lora pattern needs servers that load adapters and clients "
                              f"that name them; {type(c).__name__} cannot", field=field)

    def route(client: object, adapter: str | None) -> None:
        cast(Any, client).model = adapter  # every later request names this adapter

    return LoraPublisher(cast(Any, clients), plan=plan, gate=gate, route=route, max_rank=max_rank)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))
