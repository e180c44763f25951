"""Nouns shared by the scheduler, the ready bank and the driver.

Owns the scheduler's decisions as data (:class:`Launch`, :class:`Abort`, :class:`EmitBatch`)
and its closed vocabularies; re-exports the attempt nouns of ``rollbank.episodes.attempt``.

Invariant: decisions are immutable values; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from rollbank.episodes.attempt import (
    NULL_CONTEXT,
    AttemptContext,
    AttemptKey,
    AttemptSpec,
    NullAttemptContext,
)

if TYPE_CHECKING:
    from rollbank.batching.batch import Batch


class StragglerPolicy(StrEnum):
    """What happens to unfinished attempts once a batch has enough complete groups."""

    WAIT = "wait"  # the batch is emitted only when every group in the pool is terminal
    CARRY = "carry"  # emit now; unfinished attempts keep running and join the next batch
    ABORT = "abort"  # emit now; unfinished attempts are cancelled and reported as waste


class SchedulingMode(StrEnum):
    """``optimized``: ready bank, over-provisioning, priorities. ``naive``: the baseline.

    ``naive`` is a launch-order synchronous batch: exactly ``groups_per_batch`` groups are
    launched per batch (no over-provisioning), the batch waits for all of them, waiting
    attempts are served first-come-first-served (no sibling priority), an infra failure is not
    re-run (retry limit 0), and a dropped group is not replaced (the batch is smaller).
    """

    OPTIMIZED = "optimized"
    NAIVE = "naive"


# ---------------------------------------------------------------- decisions (data)
@dataclass(frozen=True)
class Launch:
    """Start this attempt now (a sandbox slot has been reserved for it)."""

    spec: AttemptSpec


@dataclass(frozen=True)
class Abort:
    """Cancel this in-flight attempt (straggler policy ``abort`` or end of collection)."""

    key: AttemptKey
    why: str


@dataclass(frozen=True)
class EmitBatch:
    """A batch is ready; the driver hands ``batch`` to the trainer."""

    batch: Batch


Decision = Launch | Abort | EmitBatch


__all__ = [
    "NULL_CONTEXT",
    "Abort",
    "AttemptContext",
    "AttemptKey",
    "AttemptSpec",
    "EmitBatch",
    "Launch",
    "NullAttemptContext",
    "SchedulingMode",
    "StragglerPolicy",
]
