"""The staleness gate as the ready bank's strategy: a complete group is scored before release.

:class:`StalenessGating` is a :class:`~rollbank.scheduling.policy.group_gate.GroupGate`,
injected with ``Scheduler(..., gate=StalenessGating(staleness))``. Pure (decisions as data,
events in the bank's outbox, time from the bank's clock); the scoring I/O is the driver's
(:mod:`rollbank.scheduling.drivers.group_scoring`). Every emitted batch carries the staleness
columns (:func:`gated_columns`): per row the current log-probs, the correction of
``staleness.correction.mode``, the gate's verdict / weight / reasons / rare-success flag /
staleness re-runs and the row's divergence; per batch the ``staleness_report`` with the gate
counters of the window (retried attempts included) and the rare-success choice.

Rules (docs/staleness.md, "What the ready bank must do")
- When every slot of a group is terminal, the group is not completed: it stays ``open`` and
  a :class:`~rollbank.scheduling.policy.group_gate.NeedsScoring` (its valid siblings and
  their staleness re-runs so far) is queued for the driver (:meth:`StalenessGating.drain`).
  A group without valid siblings needs no scoring and completes (dropped) at once.
- :meth:`StalenessGating.on_scored` runs the pure gate (:func:`rollbank.staleness.rows.judge_group`)
  on the current policy's log-probs. One ``gated`` event per judged attempt. Every ``retry``
  slot is handled like an infra retry: its attempt is settled ``retried`` (a ``retried``
  event), the slot re-runs with the same seed (``retry + 1``, ``stale_retries + 1``) and the
  :class:`~rollbank.scheduling.policy.bank_records.Retry` keys are returned for the scheduler
  to launch; when they finish, the whole group is scored and judged again (the policy may
  have moved meanwhile). Without a retry the group completes with the kept siblings only
  (``exclude`` slots: waste ``stale_final``); advantages are over the kept siblings.
- A scoring result for a group that is no longer waiting for one (aborted by the straggler
  policy, or closed) is ignored.
- :attr:`StalenessGating.counters` counts the gate's decisions since the last
  :meth:`StalenessGating.take_counters`: every ``retry`` verdict when it is made, every other
  verdict once, when its group completes.

Invariant: the ledger's exactly-once accounting holds (a re-run slot's attempt is settled
``retried`` exactly once, an excluded one ``waste`` exactly once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from rollbank.batching.batch import Batch, StalenessColumns
from rollbank.scheduling.policy.bank_records import GroupDone, Retry
from rollbank.scheduling.policy.events import AttemptEvent, EventKind
from rollbank.scheduling.policy.group_gate import GatedBank, Member, NeedsScoring
from rollbank.scheduling.policy.scores import GroupScores
from rollbank.scheduling.policy.types import AttemptKey
from rollbank.staleness.config import StalenessConfig
from rollbank.staleness.estimators import ScoredTokens, batch_divergence
from rollbank.staleness.gate import GateCounters, GateDecision, StalenessGate, Verdict
from rollbank.staleness.report import staleness_report
from rollbank.staleness.rows import (
    GroupMember,
    JudgedGroup,
    batch_corrections,
    judge_group,
    row_values,
)


@dataclass(frozen=True)
class GatedGroup:
    """What the gate decided for a released group (kept until the group leaves the bank)."""

    judged: JudgedGroup
    scores: GroupScores
    stale_retries: dict[str, int]  # trajectory id -> staleness re-runs of its slot


@dataclass(frozen=True, kw_only=True)
class AttemptGated(AttemptEvent):
    """``gated``: the staleness gate's decision for one valid attempt (``verdict`` admit /
    downweight / retry / exclude). ``scorer_version`` is the version that scored it."""

    verdict: str
    weight: float
    reasons: tuple[str, ...]
    rare_success: bool
    k3: float | None
    ess: float | None
    geo_ratio: float | None
    version_lag: int
    scorer: str
    scorer_version: int
    stale_retries: int
    unmeasured_why: str = ""


class StalenessGating:
    """Complete groups pass the staleness gate before the bank releases them."""

    def __init__(self, staleness: StalenessConfig) -> None:
        self.staleness = staleness
        self.gate = StalenessGate(staleness.gate)
        self.counters = GateCounters()
        self._pending: list[NeedsScoring] = []
        self._scoring: dict[str, NeedsScoring] = {}  # group id -> members awaiting scores
        self._gated: dict[str, GatedGroup] = {}  # released groups' decisions

    # ------------------------------------------------------------ scoring hand-off
    def hold(self, group_id: str, members: Sequence[Member]) -> bool:
        if not members:
            return False  # nothing to score: the group completes (dropped) at once
        need = NeedsScoring(group_id, tuple(k for k, _, _ in members),
                            tuple(t for _, t, _ in members), tuple(r for _, _, r in members))
        self._scoring[group_id] = need
        self._pending.append(need)
        return True

    def drain(self) -> list[NeedsScoring]:
        out, self._pending = self._pending, []
        return out

    @property
    def pending(self) -> int:
        return len(self._scoring)

    def forget(self, group_id: str) -> None:
        self._gated.pop(group_id, None)  # consumed, dropped or aborted
        self._scoring.pop(group_id, None)

    def gated(self, group_id: str) -> GatedGroup | None:
        """The gate's decisions for a released group (None: not gated, or gone)."""
        return self._gated.get(group_id)

    def take_counters(self) -> GateCounters:
        """The counts since the last call (a batch's report), and start again."""
        out, self.counters = self.counters, GateCounters()
        return out

    def on_scored(self, bank: GatedBank, group_id: str,
                  scores: GroupScores) -> list[Retry] | GroupDone | None:
        """Judge the group's members on ``scores``: re-run slots (the :class:`Retry` list),
        or complete the group. ``None``: the group no longer waits for scores."""
        need = self._scoring.pop(group_id, None)
        if need is None or not bank.is_open(group_id):
            return None
        members = [GroupMember(t, scores.logprobs.get(t.trajectory_id), r)
                   for t, r in zip(need.trajectories, need.stale_retries, strict=True)]
        judged = judge_group(self.gate, group_id, members, scores.version,
                             self.staleness.estimators)
        key_of = {k.slot: k for k in need.keys}
        retries_of = {k.slot: r for k, r in zip(need.keys, need.stale_retries, strict=True)}
        for d in judged.decision.decisions:
            self._gated_event(bank, key_of[d.slot], d, scores, retries_of[d.slot])
        retry = [d for d in judged.decision.decisions if d.verdict is Verdict.RETRY]
        if retry:
            self.counters.groups_with_retry += 1
            out = []
            for d in retry:
                self.counters.add(d)
                out.append(bank.rerun_stale(key_of[d.slot]))
            return out
        excluded = frozenset(judged.decision.excluded_slots)
        self.counters.groups += 1
        for d in judged.decision.decisions:
            self.counters.add(d)
        done = bank.complete(group_id, excluded)
        if done.ready:
            stale = {t.trajectory_id: r for t, r in zip(need.trajectories, need.stale_retries,
                                                        strict=True)}
            self._gated[group_id] = GatedGroup(judged, scores, stale)
        return done

    def batch(self, batch: Batch) -> Batch:
        gated = {g.group_id: self.gated(g.group_id) for g in batch.groups}
        columns = gated_columns(batch, gated, self.take_counters(), self.staleness)
        return replace(batch, staleness=columns)

    def _gated_event(self, bank: GatedBank, key: AttemptKey, d: GateDecision,
                     scores: GroupScores, stale_retries: int) -> None:
        if not bank.recording:
            return
        tid = d.trajectory_id
        bank.outbox.append(AttemptGated(
            kind=EventKind.GATED, t=bank.clock.now(), attempt_id=key.attempt_id,
            group_id=key.group_id, task_id=bank.task_of(key.group_id), slot=key.slot,
            retry=key.retry, seq=key.seq,
            verdict=d.verdict.value, weight=d.weight, reasons=tuple(r.value for r in d.reasons),
            rare_success=d.rare_success, k3=d.k3, ess=d.ess, geo_ratio=d.geo_ratio,
            version_lag=d.version_lag, scorer=scores.scorer, scorer_version=scores.version,
            stale_retries=stale_retries, unmeasured_why=scores.errors.get(tid, ""),
        ))


def gated_columns(batch: Batch, gated: dict[str, GatedGroup | None], counters: GateCounters,
                  config: StalenessConfig) -> StalenessColumns:
    """The staleness columns and report of ``batch`` from its groups' gate decisions (a
    group without any, e.g. released before gating existed, keeps the neutral values)."""
    decisions: list[GateDecision] = []
    scored: list[ScoredTokens] = []
    versions: list[int] = []
    scorers: set[str] = set()
    judged = [(group, g, {d.trajectory_id: d for d in g.judged.decision.decisions})
              for group in batch.groups if (g := gated.get(group.group_id)) is not None]
    for group, g, by_id in judged:
        for t in group.trajectories:
            decisions.append(by_id[t.trajectory_id])
            s = g.judged.scored.get(t.trajectory_id)
            if s is not None:
                scored.append(s)
        versions.append(g.scores.version)
        scorers.add(g.scores.scorer)
    results, correction_stats = batch_corrections(scored, config.correction)
    corrections = {s.trajectory_id: r for s, r in zip(scored, results, strict=True)}
    rows: dict[str, dict[str, Any]] = {}
    for group, g, by_id in judged:
        for t in group.trajectories:
            tid = t.trajectory_id
            rows[tid] = row_values(
                by_id[tid], scored=g.judged.scored.get(tid), correction=corrections.get(tid),
                divergence=g.judged.divergence.get(tid), loss_mask=t.loss_mask,
                scorer_version=g.scores.version, stale_retries=g.stale_retries.get(tid, 0))
    current = max(versions) if versions else None
    pooled = batch_divergence(scored, current, config.estimators) if scored and current is not None \
        else None
    report = staleness_report(pooled, decisions, counters=counters,
                              correction=correction_stats if scored else None,
                              current_version=current, scorer=",".join(sorted(scorers)))
    rare = [d for d in decisions if d.rare_success]
    report["rare_success_choice"] = {
        "keep_rare_success": config.gate.keep_rare_success,
        "kept": len(rare), "weights": [d.weight for d in rare],
        "min_weight": config.gate.rare_success_min_weight,
    }
    report["scoring_versions"] = sorted(set(versions))
    return StalenessColumns(rows, report)
