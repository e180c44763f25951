"""The inference plane of a collection: start (managed), connect to (external) or fake the
servers a :class:`~rollbank.collect_config.InferenceSection` describes, and hand out one client
per server URL with the model's tokenizer. Used by the collector, ``rollbank train`` and eval.

``first_ready=True`` (the collector): managed servers are handed over as soon as the first is
healthy; ``plane.feed`` then says which serve now and announces the others as they join
(:class:`~rollbank.inference.protocol.ServerFeed`). Otherwise every server is healthy on entry
and ``feed`` is None.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from rollbank.collect_config import InferenceSection
from rollbank.errors import ConfigError, RouteMissingError, WeightVersionError
from rollbank.inference.protocol import InferenceClient, ServerFeed, Tokenizer
from rollbank.metrics.bound import Capacity
from rollbank.metrics.calibrate import calibrate
from rollbank.metrics.calibration_cache import calibrate_or_reuse, calibration_cache


@dataclass
class InferencePlane:
    """Opened inference servers: one client per server URL and the model's tokenizer."""

    clients: dict[str, InferenceClient]
    tokenizer: Tokenizer
    vocab_size: int
    description: str
    fingerprint: str | None = None  # what the servers' capacity depends on (None: unknown)
    feed: ServerFeed | None = None  # servers still starting (None: all of ``clients`` serve)
    # managed servers: record the full checkpoint (path, version) a restarted server re-applies
    remember_weights: Callable[[str, int], None] | None = None
    # managed servers: record the LoRA adapter (name, path, version) a restarted server re-loads
    remember_adapter: Callable[[str, str, int], None] | None = None

    @property
    def serving(self) -> tuple[str, ...]:
        """URLs of the servers serving now."""
        return tuple(self.clients) if self.feed is None else self.feed.ready

    async def reset_caches(self, say: Callable[[str], None] | None = None) -> None:
        """Empty every serving server's prefix cache. A server without the route (a plain
        ``vllm serve``: no ``VLLM_SERVER_DEV_MODE``) keeps its cache, said once per server."""
        for url in self.serving:
            try:
                await self.clients[url].reset_prefix_cache()
            except RouteMissingError:
                if say is not None:
                    say(f"{url}: no /reset_prefix_cache (start it with VLLM_SERVER_DEV_MODE=1 to "
                        "have it): the calibration's probe prompts stay in its prefix cache")


async def calibrate_plane(plane: InferencePlane, *, sandbox_slots: int, verifier_slots: int | None,
                          max_age_s: float, say: Callable[[str], None] | None = None) -> Capacity:
    """The servers' capacity for the lower bound: a cached calibration of the same fleet
    (``max_age_s``), else measured. Measuring needs every server (the aggregate rates are the
    whole fleet's), so with servers still starting (``plane.feed``) it waits for them; with a
    cached calibration nothing waits and collection starts on the first server."""
    t0 = time.monotonic()

    async def measure() -> Capacity:
        serving = plane.serving if plane.feed is None else await plane.feed.settled()
        return await calibrate({u: plane.clients[u] for u in serving}, sandbox_slots=sandbox_slots,
                               vocab_size=plane.vocab_size, verifier_slots=verifier_slots)

    capacity, fresh = await calibrate_or_reuse(
        measure, cache=calibration_cache(max_age_s), fingerprint=plane.fingerprint,
        sandbox_slots=sandbox_slots, verifier_slots=verifier_slots,
        on_measure=None if say is None else lambda: say(
            "calibrating the servers' capacity for the lower bound (a few probe requests"
            f"{'' if plane.feed is None else ', once every server serves'})..."))
    await plane.reset_caches(say)
    if say is not None:
        say(f"{'calibrated' if fresh else 'reused the calibration ' + capacity.source} in "
            f"{time.monotonic() - t0:.0f} s: decode {capacity.decode_rate_single:.0f} "
            f"tok/s alone, {capacity.decode_rate_max:.0f} tok/s aggregate")
    return capacity


def vocab_size(tok: Tokenizer) -> int:
    """The tokenizer's vocabulary size (256, a byte-level vocabulary, if it does not say)."""
    return int(getattr(tok, "vocab_size", 0) or 256)


#: how each external server's versions are labelled (InferencePlane.description, start line)
ENGINE_VERSIONS = "the engine"
ROLLBANK_VERSIONS = "rollbank's publication records (the server reports none)"


async def connect_external(urls: list[str], mode: str, into: dict[str, Any],
                           make: Callable[..., Any]) -> dict[str, str]:
    """Connect a client (``make(url, versions_from_engine=...)``) to each URL into ``into``;
    returns where each server's weight versions come from. ``mode`` is
    ``inference.external_versions``: ``engine`` refuses a server that reports no version
    (naming the URL and the flag), ``rollbank`` never asks, ``auto`` falls back to
    rollbank's records for a standard ``vllm serve``."""
    labels: dict[str, str] = {}
    for url in urls:
        key = url.rstrip("/")
        client = make(url, versions_from_engine=mode != "rollbank")
        into[key] = client
        try:
            await client.connect()
            labels[key] = ENGINE_VERSIONS if mode != "rollbank" else ROLLBANK_VERSIONS
        except WeightVersionError as exc:
            if mode == "engine":
                raise ConfigError(f"{exc}; or take versions from rollbank's own publication "
                                  "records: --inference.external-versions rollbank",
                                  field="inference.external_versions") from exc
            await client.aclose()
            into[key] = client = make(url, versions_from_engine=False)
            await client.connect()
            labels[key] = ROLLBANK_VERSIONS
    return labels


@contextlib.asynccontextmanager
async def open_inference(cfg: InferenceSection, *, max_model_len: int,
                         say: Callable[[str], None] | None = None,
                         first_ready: bool = False) -> AsyncIterator[InferencePlane]:
    """Start (managed), connect to (external) or fake the inference servers."""
    if cfg.kind == "fake":
        from rollbank.inference.fake import FakeTokenizer, make_fake_fleet

        _, fakes = make_fake_fleet(cfg.fake_servers, decode_s_per_token=cfg.fake_decode_s_per_token,
                                   prefill_s_per_token=cfg.fake_prefill_s_per_token,
                                   max_model_len=max_model_len, eos_probability=0.02)
        ftok = FakeTokenizer()
        yield InferencePlane({c.base_url: c for c in fakes}, ftok, ftok.vocab_size,
                             f"{cfg.fake_servers} fake servers")
        return
    from rollbank.inference.models import ensure_model
    from rollbank.inference.tokenizer import load_tokenizer
    from rollbank.inference.vllm_client import VLLMClient

    if cfg.kind == "external":
        if not cfg.urls or cfg.tokenizer is None:
            raise ConfigError("external inference needs urls and tokenizer", field="inference")
        model_dir = await asyncio.to_thread(ensure_model, cfg.tokenizer)
        tok = load_tokenizer(model_dir)
        clients: dict[str, VLLMClient] = {}
        try:
            labels = await connect_external(cfg.urls, cfg.external_versions, clients, VLLMClient)
            if say is not None:
                for url, label in labels.items():
                    say(f"{url}: weight versions from {label}")
            yield InferencePlane(dict(clients), tok, vocab_size(tok), f"external {cfg.urls} "
                                 f"(versions: {', '.join(sorted(set(labels.values())))})")
        finally:
            for c in clients.values():
                await c.aclose()
        return
    from rollbank.inference.server import ManagedServers

    managed = ManagedServers(
        cfg.managed, on_ready=None if say is None else
        lambda i, secs: say(f"server {i} ready in {secs:.0f} s"),
        wait="first" if first_ready else "all",
        on_failed=None if say is None else
        lambda i, exc: say(f"server {i} failed to start ({exc}); going on with the others"))
    if say is not None:
        say(managed.plan.line())
        say(f"starting {managed.plan.num_servers} vLLM server(s) for {cfg.managed.model} "
            f"(compile: {cfg.managed.compile})...")
    async with managed as servers:
        assert servers.model_dir is not None
        tok = load_tokenizer(servers.model_dir)
        yield InferencePlane(dict(zip(servers.urls, servers.clients, strict=True)), tok,
                             vocab_size(tok),
                             f"{managed.plan.num_servers} managed vLLM servers, model {cfg.managed.model}",
                             fingerprint=servers.fingerprint(),
                             feed=servers if first_ready and len(servers.servers) > 1 else None,
                             remember_weights=servers.remember_weights,
                             remember_adapter=servers.remember_adapter)
