"""The publication seam: one :class:`Publisher` per pattern, one record per publication.

Patterns (issue #10): ``checkpoint`` (atomic versioned safetensors directory, engines
hot-reload it), ``direct`` (tensors pushed from the trainer process to running vLLM servers
over vLLM's weight-sync routes, no checkpoint on storage), ``colocated`` (an in-process engine
receives the tensors by reference), ``lora`` (a new adapter per version).

Every publisher:

- validates names/shapes against the served model *before* pausing anything
  (:class:`~rollbank.errors.WeightMismatchError`: nothing touched);
- closes admission, pauses generation with the in-flight plan, applies, names the version on
  the engine, resets the prefix cache, resumes, reopens admission;
- on a failure halfway rolls every engine it can reach back to the previous weights and
  raises :class:`~rollbank.errors.PublicationError` whose ``serving`` says which version
  each engine serves afterwards — never mixed weights on one engine;
- returns a :class:`PublicationRecord`: publication latency (``ready_at`` = trainer step done
  -> every engine serving the new version) apart from the apply pause (generation stopped).

This is the one publication stack: ``rollbank train`` (``training/loop.py``), ``rollbank
serve-collector`` (``service/run.py``) and ``rollbank bench publish`` all publish through it.
``wants_tensors`` says what the trainer hands over: a copy of its tensors (direct, colocated)
or the saved version directory (checkpoint, lora); :func:`update_of` makes the update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from rollbank.inference.protocol import PauseMode

Pattern = Literal["checkpoint", "direct", "colocated", "lora"]
InflightPlan = Literal["finish", "abort", "pause"]

# finish: drain, then swap; abort: abort in-flight (partial tokens returned with
# finish_reason "abort", the caller re-queues); pause: freeze, swap, resume (tokens after
# the resume carry the new version; their KV cache from before is kept).
PLAN_TO_PAUSE: dict[InflightPlan, PauseMode] = {"finish": "wait", "abort": "abort", "pause": "keep"}


@dataclass(frozen=True)
class WeightUpdate:
    """What the trainer hands over: tensors in memory (HF names -> torch tensors) or a
    directory (full safetensors checkpoint, or a PEFT adapter when ``lora``)."""

    tensors: Mapping[str, Any] | None = None
    path: str | None = None
    lora: bool = False

    def __post_init__(self) -> None:
        if (self.tensors is None) == (self.path is None):
            raise ValueError("a WeightUpdate has either tensors or a path")


@dataclass(frozen=True)
class PublicationRecord:
    """One publication, timed on the publisher's clock (seconds)."""

    pattern: str
    version: int
    previous_version: int
    plan: str
    ready_at: float
    paused_at: float
    resumed_at: float
    serving_at: float
    tensors: int = 0  # tensors sent (after compaction)
    bytes: int = 0
    steps_s: dict[str, float] = field(default_factory=dict)
    serving: dict[str, int] = field(default_factory=dict)  # engine -> version after
    lost: tuple[str, ...] = ()  # engines that could not be reached afterwards (dead)
    ok: bool = True
    error: str | None = None

    @property
    def publication_s(self) -> float:
        """Trainer step done -> every engine serving the new version."""
        return self.serving_at - self.ready_at

    @property
    def apply_pause_s(self) -> float:
        """How long generation was stopped."""
        return self.resumed_at - self.paused_at

    def to_dict(self) -> dict[str, object]:
        return {
            "pattern": self.pattern,
            "version": self.version,
            "previous_version": self.previous_version,
            "plan": self.plan,
            "publication_s": self.publication_s,
            "apply_pause_s": self.apply_pause_s,
            "tensors": self.tensors,
            "bytes": self.bytes,
            "steps_s": dict(self.steps_s),
            "serving": dict(self.serving),
            "lost": list(self.lost),
            "ok": self.ok,
            "error": self.error,
        }


def update_of(weights: Path | Mapping[str, Any], *, lora: bool = False) -> WeightUpdate:
    """The update for a saved directory (``lora``: a PEFT adapter's) or tensors."""
    if isinstance(weights, Path):
        return WeightUpdate(path=str(weights), lora=lora)
    return WeightUpdate(tensors=weights, lora=lora)


class Publisher(Protocol):
    """Installs new weights on every engine it owns."""

    @property
    def pattern(self) -> Pattern: ...

    @property
    def wants_tensors(self) -> bool:
        """True: hand over a copy of the trainer's tensors (the checkpoint is written after,
        off the critical path); False: the saved version directory."""
        ...

    @property
    def version(self) -> int:
        """The version every engine serves (last successful publication)."""
        ...

    async def publish(
        self, update: WeightUpdate, *, version: int, ready_at: float | None = None
    ) -> PublicationRecord:
        """Install ``update`` as ``version``; ``ready_at`` = when the trainer step finished."""
        ...

    async def aclose(self) -> None: ...
