"""The publication pattern of ``rollbank train`` (``loop.publisher``), over the publishing seam.

:func:`build_publisher` builds the :class:`rollbank.inference.publishing.Publisher` (the one
seam: validation before pausing, the fleet's safe order and rollback) the config names over the
opened inference plane; the loop publishes through it directly:

- ``checkpoint``: the saved full version directory is hot-loaded by every engine
  (``collective_rpc reload_weights`` + ``/update_weight_version``);
- ``direct``: a copy of the trainer's tensors goes to every server through vLLM's weight-sync
  routes and the ``rollbank_shm`` backend (staged in ``/dev/shm`` before the pause, only
  changed tensors after the first publication); the checkpoint is written after, off the
  publication's critical path. Needs servers started with ``weight_transfer_backend =
  "rollbank_shm"`` (``load_train_config`` sets it for managed servers);
- ``lora``: the saved adapter directory is loaded as ``policy-v<version>`` on every server
  before the pause; the pause names the version; the clients then send every request to the
  new adapter (their ``model``, switched inside the pause). Needs ``--enable-lora`` with
  ``max_lora_rank >= rank`` (``load_train_config`` sets it for managed servers);
- ``colocated``: no servers: the trainer's process runs one ``vllm.LLM`` engine
  (:func:`open_colocated`: the model, dtype, context and KV cache of
  ``collect.inference.managed``), the episodes generate through a
  :class:`~rollbank.inference.publishing.colocated_client.ColocatedClient` over it, and each
  publication hands the trainer's tensors to the same engine by reference (staged into a shadow
  of the model while generation goes on, swapped in between two engine steps). Plans ``pause``
  (the default for this pattern) and ``abort``.

Cache: with ``cache_salt`` per version (the clients salt every request with the version they
serve, :mod:`rollbank.inference.vllm_wire`), the ``pause`` plan skips the prefix-cache reset:
new requests cannot hit blocks of an older version, and frozen requests keep their own KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rollbank.errors import ConfigError
from rollbank.inference.protocol import AdmissionGate, InferenceClient
from rollbank.inference.publishing.protocol import Publisher
from rollbank.training.loop_config import TrainConfig

if TYPE_CHECKING:
    from rollbank.inference_plane import InferencePlane


def _need(clients: Sequence[InferenceClient], method: str, pattern: str) -> None:
    for c in clients:
        if not callable(getattr(c, method, None)):
            raise ConfigError(f"the {pattern} pattern needs servers with {method!r}; "
                              f"{type(c).__name__} at {c.base_url} has none", field="loop.publisher")


def build_publisher(config: TrainConfig, clients: Sequence[InferenceClient], gate: AdmissionGate,
                    model_dir: Path) -> Publisher:
    """The pattern ``config.loop.publisher`` names, over ``clients`` (``model_dir``: the served
    model's folder, the reference of names/shapes and the direct pattern's first diff base)."""
    from rollbank.inference.publishing import (
        CheckpointPublisher,
        DirectPublisher,
        ServedWeights,
    )
    from rollbank.inference.publishing.lora import routed_lora_publisher

    loop = config.loop
    plan = loop.inflight
    pattern = loop.publisher
    if pattern == "colocated":
        return colocated_publisher(config, clients, model_dir)
    salted = loop.cache_salt and all(hasattr(c, "salt_by_version") for c in clients)
    for c in clients:  # requests carry their version's cache_salt from now on
        if hasattr(c, "salt_by_version"):
            c.salt_by_version = salted
    if pattern == "checkpoint":
        _need(clients, "reload_weights", pattern)
        ckpt = CheckpointPublisher(cast(Any, clients), model_dir, plan=plan, gate=gate)
        ckpt.fleet.keep_kv = salted
        return ckpt
    if pattern == "direct":
        _need(clients, "update_weights", pattern)
        served = ServedWeights.from_checkpoint(model_dir)
        direct = DirectPublisher(cast(Any, clients), served, plan=plan, compact=loop.compact, gate=gate)
        direct.fleet.keep_kv = salted
        return direct
    return routed_lora_publisher(
        clients, plan=plan, gate=gate, field="loop.publisher",
        max_rank=config.collect.inference.managed.max_lora_rank
        if config.collect.inference.kind == "managed" else None)



def colocated_publisher(config: TrainConfig, clients: Sequence[InferenceClient],
                        model_dir: Path) -> Publisher:
    """The colocated pattern over the plane :func:`open_colocated` opened (its one client's
    in-process engine; the served weights' CPU copy is the diff and rollback base)."""
    from rollbank.inference.publishing import ColocatedPublisher, ServedWeights
    from rollbank.inference.publishing.colocated_client import ColocatedClient

    if len(clients) != 1 or not isinstance(clients[0], ColocatedClient):
        names = ", ".join(type(c).__name__ for c in clients)
        raise ConfigError(f"the colocated pattern needs the in-process engine of open_colocated, "
                          f"not {names}", field="loop.publisher")
    loop = config.loop
    if loop.inflight == "finish":
        raise ConfigError("the colocated engine offers loop.inflight = 'pause' or 'abort'",
                          field="loop.inflight")
    return ColocatedPublisher(clients[0].engine, ServedWeights.from_checkpoint(model_dir),
                              plan=loop.inflight, compact=loop.compact)


@contextlib.asynccontextmanager
async def open_colocated(config: TrainConfig, *, say: Callable[[str], None] | None = None
                         ) -> AsyncIterator[InferencePlane]:
    """The inference plane of the colocated pattern: one ``vllm.LLM`` engine in this process
    (``collect.inference.managed``: model, dtype, KV cache GiB, compile; the context is
    ``collect.inference.managed.max_model_len``), behind one :class:`ColocatedClient`."""
    from rollbank.inference.models import ensure_model
    from rollbank.inference.publishing import ColocatedEngine
    from rollbank.inference.publishing.colocated_client import ColocatedClient
    from rollbank.inference.tokenizer import load_tokenizer
    from rollbank.inference_plane import InferencePlane, vocab_size

    managed = config.collect.inference.managed
    model_dir = await asyncio.to_thread(ensure_model, managed.model)
    plan = managed.plan()
    if say is not None:
        say(f"{plan.line()}; colocated: starting one vLLM engine for {managed.model} in this process...")
    t0 = time.monotonic()
    engine = await asyncio.to_thread(
        ColocatedEngine, model_dir, dtype=plan.dtype or "auto",
        max_model_len=managed.max_model_len,
        kv_cache_gib=max(1, round(managed.kv_cache_gib)), seed=0,
        enforce_eager=managed.compile == "eager")
    if say is not None:
        say(f"colocated engine ready in {time.monotonic() - t0:.0f} s")
    client = ColocatedClient(engine)
    tok = load_tokenizer(model_dir)
    try:
        yield InferencePlane({client.base_url: client}, tok, vocab_size(tok),
                             f"colocated vLLM engine in the trainer's process, model {managed.model}")
    finally:
        await client.aclose()


def open_train_inference(config: TrainConfig, *, say: Callable[[str], None] | None = None
                         ) -> contextlib.AbstractAsyncContextManager[InferencePlane]:
    """The inference plane ``rollbank train`` collects with: the in-process engine for the
    colocated pattern, else the servers ``collect.inference`` describes."""
    if config.loop.publisher == "colocated":
        return open_colocated(config, say=say)
    from rollbank.inference_plane import open_inference

    return open_inference(config.collect.inference,
                          max_model_len=config.collect.runner.max_model_len, say=say)


def pattern_publisher(config: TrainConfig) -> Callable[[InferencePlane, AdmissionGate], Publisher]:
    """The ``make_publisher`` of ``train_with`` for ``config.loop.publisher`` (blocking: it may
    fetch the model folder and reads its tensors; run it in a thread)."""
    def make(plane: InferencePlane, gate: AdmissionGate) -> Publisher:
        from rollbank.inference.models import ensure_model

        return build_publisher(config, list(plane.clients.values()), gate, ensure_model(config.trainer.model))

    return make
