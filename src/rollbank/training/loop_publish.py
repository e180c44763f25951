"""The publication pattern of ``rollbank train`` (``loop.publisher``), over the publishing seam.

:class:`PatternPublisher` adapts one :class:`rollbank.inference.publishing.Publisher` (the
seam with validation before pausing, the fleet's safe order and rollback) to the loop's
:class:`~rollbank.training.loop.Publisher`; :func:`publisher_factory` builds the one the config
names over the opened inference plane:

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
- ``colocated``: refused with a usage error. It needs the engine inside the trainer's process
  (``vllm.LLM``), but ``rollbank train`` collects through the inference plane's HTTP clients
  against vLLM servers in their own processes (managed or external): the engine the episodes
  generate with is never in the trainer's process, so there is nothing to hand tensors to by
  reference. ``rollbank bench publish --patterns colocated`` measures the pattern on its own.

Cache: with ``cache_salt`` per version (the clients salt every request with the version they
serve, :mod:`rollbank.inference.vllm_wire`), the ``pause`` plan skips the prefix-cache reset:
new requests cannot hit blocks of an older version, and frozen requests keep their own KV.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rollbank.errors import ConfigError
from rollbank.inference.protocol import AdmissionGate, InferenceClient
from rollbank.inference.publishing.protocol import Publisher as SeamPublisher
from rollbank.inference.publishing.protocol import WeightUpdate
from rollbank.training.loop import Publication, Publisher, Weights
from rollbank.training.loop_config import COLOCATED_REFUSAL, TrainConfig

if TYPE_CHECKING:
    from rollbank.inference_plane import InferencePlane


class PatternPublisher:
    """The loop's publisher over one pattern of the publishing seam."""

    def __init__(self, inner: SeamPublisher, *, wants_tensors: bool, lora: bool = False) -> None:
        self.inner = inner
        self.wants_tensors = wants_tensors
        self.lora = lora

    async def publish(self, version: int, weights: Weights) -> Publication:
        if isinstance(weights, Path):
            if self.wants_tensors:
                raise TypeError(f"the {self.inner.pattern} pattern publishes tensors, not a directory")
            update = WeightUpdate(path=str(weights), lora=self.lora)
        else:
            if not self.wants_tensors:
                raise TypeError(f"the {self.inner.pattern} pattern publishes a saved directory")
            update = WeightUpdate(tensors=weights)
        record = await self.inner.publish(update, version=version)
        return Publication(version, record.apply_pause_s, record.to_dict())

    async def aclose(self) -> None:
        await self.inner.aclose()


def _need(clients: Sequence[InferenceClient], method: str, pattern: str) -> None:
    for c in clients:
        if not callable(getattr(c, method, None)):
            raise ConfigError(f"the {pattern} pattern needs servers with {method!r}; "
                              f"{type(c).__name__} at {c.base_url} has none", field="loop.publisher")


def build_publisher(config: TrainConfig, clients: Sequence[InferenceClient], gate: AdmissionGate,
                    model_dir: Path) -> PatternPublisher:
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
        raise ConfigError(COLOCATED_REFUSAL, field="loop.publisher")
    salted = loop.cache_salt and all(hasattr(c, "salt_by_version") for c in clients)
    for c in clients:  # requests carry their version's cache_salt from now on
        if hasattr(c, "salt_by_version"):
            c.salt_by_version = salted
    if pattern == "checkpoint":
        _need(clients, "reload_weights", pattern)
        ckpt = CheckpointPublisher(cast(Any, clients), model_dir, plan=plan, gate=gate)
        ckpt.fleet.keep_kv = salted
        return PatternPublisher(ckpt, wants_tensors=False)
    if pattern == "direct":
        _need(clients, "update_weights", pattern)
        served = ServedWeights.from_checkpoint(model_dir)
        direct = DirectPublisher(cast(Any, clients), served, plan=plan, compact=loop.compact, gate=gate)
        direct.fleet.keep_kv = salted
        return PatternPublisher(direct, wants_tensors=True)
    lora = routed_lora_publisher(
        clients, plan=plan, gate=gate, field="loop.publisher",
        max_rank=config.collect.inference.managed.max_lora_rank
        if config.collect.inference.kind == "managed" else None)
    return PatternPublisher(lora, wants_tensors=False, lora=True)



def pattern_publisher(config: TrainConfig) -> Callable[[InferencePlane, AdmissionGate], Publisher]:
    """The ``make_publisher`` of ``train_with`` for ``config.loop.publisher`` (blocking: it may
    fetch the model folder and reads its tensors; run it in a thread)."""
    def make(plane: InferencePlane, gate: AdmissionGate) -> Publisher:
        from rollbank.inference.models import ensure_model

        return build_publisher(config, list(plane.clients.values()), gate, ensure_model(config.trainer.model))

    return make
