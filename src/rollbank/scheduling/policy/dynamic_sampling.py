"""Dynamic sampling in the ready bank (DAPO; verl's ``filter_groups``), bounded so a batch
always comes. Pure: counts and choices over the bank's complete groups, time from the clock.

Owns :class:`HoldBack`, used by :class:`~rollbank.scheduling.policy.ready_bank.ReadyBank` when
``bank.dynamic_sampling.enabled``.

Rules
- A complete group whose valid rewards are all equal (zero variance: every advantage is 0) is
  *held*: it stays ready in the bank, but a batch takes groups with variance first and takes a
  held group only once the held groups are *released*.
- Each held group in the bank lets the scheduler admit one group beyond ``pool_groups``
  (:meth:`HoldBack.extra_allowance`), at most ``max_extra_groups`` at a time: the bound on
  the extra groups launched while the bank waits for variance.
- The held groups are released when no group is open any more (nothing launched could still
  bring variance, and the allowance is spent or nothing more may be created), or when the
  oldest held group has waited ``max_hold_s`` (optional; the driver wakes up for it,
  ``Scheduler.wake_at``). Released, they fill the batch after
  the groups with variance, oldest first; those not needed stay in the bank.
- Every complete group is counted (``completed``), and every zero-variance one
  (``zero_variance``), so the share among all completed groups stays visible, not only the
  share in the batches.

Invariant: holding never drops or settles anything: a held group is an ordinary ready group
of the bank (delivered only by a take, returned at close like any other).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rollbank.batching.batch import GroupResult
from rollbank.scheduling.config import DynamicSamplingConfig


@dataclass
class HoldCounts:
    """Run totals: every complete group, the zero-variance ones, and how many went out."""

    completed: int = 0  # groups that entered the bank (dropped ones are not counted)
    zero_variance: int = 0  # of which all valid rewards were equal
    released: int = 0  # zero-variance groups delivered after a release
    held_at_take: int = 0  # zero-variance groups left in the bank by the last take

    def to_dict(self) -> dict[str, float | int | None]:
        share = self.zero_variance / self.completed if self.completed else None
        return {"groups_completed": self.completed,
                "zero_variance_completed": self.zero_variance,
                "zero_variance_completed_share": share,
                "zero_variance_released": self.released,
                "held_back": self.held_at_take}


class HoldBack:
    """The bank's dynamic-sampling policy (see the module docstring)."""

    def __init__(self, config: DynamicSamplingConfig) -> None:
        self.config = config
        self.counts = HoldCounts()

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def on_complete(self, zero_variance: bool) -> bool:
        """A group entered the bank; True if it is held back."""
        self.counts.completed += 1
        self.counts.zero_variance += int(zero_variance)
        return self.enabled and zero_variance

    def extra_allowance(self, held: int) -> int:
        """Groups the scheduler may admit beyond its pool for ``held`` held groups."""
        return min(held, self.config.max_extra_groups) if self.enabled else 0

    def releasing(self, held: Sequence[GroupResult], *, open_groups: int, now: float) -> bool:
        """Are the held groups released (may they fill a batch) now?"""
        if not self.enabled or not held or open_groups == 0:
            return True
        limit = self.config.max_hold_s
        return limit is not None and now - min(g.completed_at for g in held) >= limit

    def release_at(self, held: Sequence[GroupResult]) -> float | None:
        """When the time bound will release ``held`` (None: no bound, or nothing held)."""
        limit = self.config.max_hold_s
        if not self.enabled or not held or limit is None:
            return None
        return min(g.completed_at for g in held) + limit

    def choose(self, ready: Sequence[GroupResult], max_groups: int, *, release: bool
               ) -> list[GroupResult]:
        """The groups a batch takes from ``ready``: oldest launch first; with dynamic sampling
        groups with variance first, then (``release``) the held ones; counts what it left."""
        if not self.enabled:
            return sorted(ready, key=lambda g: g.seq)[:max_groups]
        varied = sorted((g for g in ready if not g.zero_variance), key=lambda g: g.seq)
        held = sorted((g for g in ready if g.zero_variance), key=lambda g: g.seq)
        out = varied[:max_groups]
        if release:
            out += held[: max_groups - len(out)]
        released = sum(1 for g in out if g.zero_variance)
        self.counts.released += released
        self.counts.held_at_take = len(held) - released
        return out
