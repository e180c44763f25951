"""Nouns shared by the scheduler, the ready bank and the driver.

Owns the scheduler's decisions as data (:class:`Launch`, :class:`Abort`, :class:`EmitBatch`)
and re-exports the attempt nouns of ``rollbank.episodes.attempt``.

Invariant: decisions are immutable values; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
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
]
