"""The scheduler with the staleness gate, and the batch columns of the gate's decisions.

:class:`GatedScheduler` is the pure :class:`~rollbank.scheduling.scheduler.Scheduler` with a
:class:`~rollbank.scheduling.gated_bank.GatedReadyBank`: complete groups wait for the
current policy's scores (:meth:`GatedScheduler.drain_scoring` hands them to the driver,
:meth:`GatedScheduler.on_scored` takes the scores back), re-run slots the gate dropped
(queued like infra retries: same seed, the group's old place), and every emitted batch
carries the staleness columns (:func:`gated_columns`): per row the current log-probs, the
correction of ``staleness.correction.mode``, the gate's verdict / weight / reasons /
rare-success flag / staleness re-runs and the row's divergence; per batch the
``staleness_report`` with the gate counters of the window (retried attempts included) and the
rare-success choice (``rare_success_choice``: whether rare successes are kept, how many were,
with what weights).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rollbank.batching.batch import Batch, StalenessColumns
from rollbank.clock import Clock
from rollbank.scheduling.config import SchedulerConfig
from rollbank.scheduling.gated_bank import GatedGroup, GatedReadyBank, NeedsScoring
from rollbank.scheduling.ready_bank import GroupDone, Retry
from rollbank.scheduling.scheduler import Scheduler
from rollbank.scheduling.scoring import GroupScores
from rollbank.scheduling.types import Decision, EmitBatch
from rollbank.staleness.config import StalenessConfig
from rollbank.staleness.estimators import ScoredTokens, batch_divergence
from rollbank.staleness.gate import GateCounters, GateDecision
from rollbank.staleness.report import staleness_report
from rollbank.staleness.rows import batch_corrections, row_values


class GatedScheduler(Scheduler):
    """A :class:`Scheduler` whose ready bank gates complete groups on measured divergence."""

    bank: GatedReadyBank

    def __init__(self, config: SchedulerConfig, task_ids: Sequence[str], clock: Clock, *,
                 staleness: StalenessConfig, record_events: bool = True) -> None:
        super().__init__(config, task_ids, clock, record_events=record_events)
        self.staleness = staleness
        # the base built a plain bank; nothing has used it yet (no group opened)
        self.bank = GatedReadyBank(self.config.bank, clock, self.outbox, staleness=staleness,
                                   record_events=record_events)

    def drain_scoring(self) -> list[NeedsScoring]:
        """Complete groups to score (the driver scores them and calls :meth:`on_scored`)."""
        return self.bank.drain_scoring()

    def on_scored(self, group_id: str, scores: GroupScores) -> list[Retry] | GroupDone | None:
        """The scores of a group handed out by :meth:`drain_scoring`: the gate decides;
        re-runs wait for a sandbox slot at the group's place (poll to launch them)."""
        out = self.bank.on_scored(group_id, scores)
        if isinstance(out, list):
            for r in out:
                heapq.heappush(self._queue, (r.key, r.task_id))
        return out

    def poll(self) -> list[Decision]:
        out = super().poll()
        return [EmitBatch(self._with_columns(d.batch)) if isinstance(d, EmitBatch) else d
                for d in out]

    def _with_columns(self, batch: Batch) -> Batch:
        gated = {g.group_id: self.bank.gated(g.group_id) for g in batch.groups}
        columns = gated_columns(batch, gated, self.bank.take_counters(), self.staleness)
        return replace(batch, staleness=columns)


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
