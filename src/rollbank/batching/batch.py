"""What a trainer receives: a :class:`Batch` of complete groups, with its accounting.

Invariants
- ``GroupResult.trajectories`` are the group's valid (trainable: model_success/model_failure)
  siblings, ordered by slot, and ``advantages[i]`` belongs to ``trajectories[i]``. Infra or
  unknown attempts never appear there: they left both the gradient and the group baseline.
- ``Batch.accounting`` counts attempts settled during this batch's window plus those carried
  over it; over a whole collection ``launched == consumed + retried + waste`` once closed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rollbank.episodes.trajectory import Trajectory


@dataclass(frozen=True)
class GroupResult:
    """One complete GRPO group as delivered to a trainer."""

    group_id: str
    task_id: str
    seq: int  # original launch order
    trajectories: tuple[Trajectory, ...]  # valid siblings, by slot
    rewards: tuple[float, ...]  # the reward used for each valid sibling
    advantages: tuple[float, ...]  # GRPO advantage per valid sibling
    zero_variance: bool  # all valid rewards equal (advantages are all 0)
    size: int  # group size n (slots)
    infra_final: int  # slots that stayed infra/unknown after the retry limit
    retries: int  # re-runs spent on this group
    launched_at: float
    completed_at: float


@dataclass(frozen=True)
class BatchAccounting:
    """Attempt accounting for one batch window (counts of attempts, seconds held).

    ``consumed`` attempts are in this batch (the ledger settles them ``consumed`` only when
    the consumer acknowledges the batch; ``acknowledged`` counts the acknowledgements of
    earlier batches settled in this window, ``unacknowledged`` the attempts of earlier
    batches still awaiting one); ``retried`` were replaced by a re-run;
    ``waste`` settled without reaching a trainer (by reason in ``waste_by_reason``);
    ``carried`` were unsettled at the batch boundary (running or waiting on siblings).
    ``launched`` counts launches inside the window. Seconds are sandbox-slot seconds.
    """

    launched: int
    consumed: int
    retried: int
    waste: int
    carried: int
    carried_running: int
    waste_by_reason: dict[str, int] = field(default_factory=dict)
    consumed_s: float = 0.0
    retried_s: float = 0.0
    waste_s: float = 0.0
    # whole-run ledger at the boundary (cumulative): launched == sum of the states
    total_launched: int = 0
    total_settled: int = 0
    acknowledged: int = 0
    unacknowledged: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DistStats:
    """Summary of one quantity over a set of attempts."""

    n: int
    mean: float
    p50: float
    p90: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class SelectionProfile:
    """Accepted batch vs the launched pool, so short-first selection bias is visible.

    ``pool_*`` cover every *valid* attempt (model_success/model_failure, the ones a batch can
    accept) that finished so far in the run, accepted or not: infra/unknown and retried
    attempts are left out on both sides, so like is compared with like.
    ``censored`` attempts never finished: still running at the boundary, or aborted (by the
    straggler policy) at any earlier boundary of the run; ``censored_elapsed`` is their time
    when observed (a lower bound on their duration), ``censored_aborted`` how many of them
    were aborted.
    """

    accepted_duration: DistStats
    pool_duration: DistStats
    accepted_tokens: DistStats
    pool_tokens: DistStats
    accepted_reward_mean: float
    pool_reward_mean: float
    censored: int
    censored_elapsed: DistStats
    censored_aborted: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Unreachable:
    """A task whose group was aborted and re-queued ``max_requeues`` times without finishing:
    unreachable within the batch budget, and no longer re-queued."""

    task_id: str
    group_id: str  # the last aborted group (``g<seq>-q<k>``)
    seq: int
    requeues: int
    longest_elapsed_s: float  # longest time any of its aborted attempts had run

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StalenessColumns:
    """Measured staleness of a batch's rows, as plain data (filled by ``rollbank.staleness``).

    ``rows`` maps a trajectory id to the values of the schema-v2 staleness columns
    (``rollbank.batching.schema.STALENESS_FIELDS``); a row without an entry gets the neutral
    values (unmeasured). ``report`` is ``rollbank.staleness.report.staleness_report(...)``:
    it goes to the manifest, the Parquet metadata and summary.json.
    """

    rows: Mapping[str, Mapping[str, Any]]
    report: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Batch:
    """One trainable batch: ``groups_per_batch`` complete groups (fewer only at the end)."""

    index: int
    groups: tuple[GroupResult, ...]
    accounting: BatchAccounting
    profile: SelectionProfile
    window_start: float  # clock time the batch window opened (previous batch, or first launch)
    ready_at: float  # clock time the batch was assembled
    complete: bool  # True when it holds groups_per_batch groups
    meta: dict[str, Any] = field(default_factory=dict)
    unreachable: tuple[Unreachable, ...] = ()  # tasks given up on in this window
    staleness: StalenessColumns | None = None  # None: no row measured (neutral columns)

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for g in self.groups for t in g.trajectories]

    def rows(self) -> Iterator[tuple[GroupResult, Trajectory, float, float]]:
        """(group, trajectory, reward, advantage) for every trainable trajectory."""
        for g in self.groups:
            for traj, r, a in zip(g.trajectories, g.rewards, g.advantages, strict=True):
                yield g, traj, r, a

    @property
    def time_to_batch_s(self) -> float:
        return self.ready_at - self.window_start
