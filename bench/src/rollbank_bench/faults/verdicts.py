"""Per-round verdicts (pure over a finished round): each injected fault joined to its attempt's
outcome, and the tally of attempts that got no fault (shared by the campaign and the soak)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollbank.batching.batch import Batch
from rollbank.episodes.spans import SPANS_KEY
from rollbank.episodes.trajectory import Trajectory
from rollbank_bench.faults.checks import (
    Verdict,
    check_group,
    confounder,
    may_be_confounded,
    verdict,
)
from rollbank_bench.faults.inject import FaultLog
from rollbank_bench.faults.kinds import EXPECT, FaultSchedule, Via
from rollbank_bench.faults.tasks import task_id_kind


class Round:
    """Verdicts and checks of one collection round."""

    def __init__(self, index: int, seed: int) -> None:
        self.index, self.seed = index, seed
        self.batch_errors: list[str] = []
        self.groups = 0
        self.trajectories: list[Trajectory] = []

    def on_batch_checker(self, cfg: Any) -> Any:
        async def check(batch: Batch, path: Path) -> None:
            for g in batch.groups:
                self.groups += 1
                self.batch_errors += check_group(g, cfg.scheduler.bank.advantages,
                                                 cfg.scheduler.bank.min_valid)
        return check


def _run_in(trajs: list[Trajectory], seed: int, sandbox: object) -> Trajectory | None:
    """The attempt whose episode ran in ``sandbox`` (a slot's retries share the seed, and the
    fault lands on whichever run reaches its fault turn first)."""
    for t in trajs:
        if t.seed == seed and any(s.get("kind") == "episode" and s.get("sandbox") == sandbox
                                  for s in t.meta.get(SPANS_KEY, [])):
            return t
    return None


def verdicts(rnd: Round, log: FaultLog, start: int, schedule: FaultSchedule,
             windows: bool, collateral: set[str],
             down: Sequence[tuple[str, float, float]] = ()) -> tuple[list[Verdict], dict[str, Any]]:
    """Every fault of the round with its attempt's outcome, and the clean attempts' tally
    (``collateral`` and ``down``: see :func:`~rollbank_bench.faults.checks.confounder`)."""
    out = _verdicts(rnd, log, start, schedule, windows)
    by_id = {t.trajectory_id: t for t in rnd.trajectories}
    for v in out[0]:
        if may_be_confounded(v.kind) and v.attempt_id is not None:
            v.confounded = confounder(by_id.get(v.attempt_id), collateral, down)
    return out


def _verdicts(rnd: Round, log: FaultLog, start: int, schedule: FaultSchedule,
              windows: bool) -> tuple[list[Verdict], dict[str, Any]]:
    trajs = rnd.trajectories
    by_id = {t.trajectory_id: t for t in trajs}
    out: list[Verdict] = []
    for inj in log.items[start:]:
        if inj.attempt_id is not None:
            out.append(verdict(inj.kind, by_id.get(inj.attempt_id), attempt_id=inj.attempt_id, **inj.detail))
        elif inj.seed is not None:
            out.append(verdict(inj.kind, _run_in(trajs, inj.seed, inj.detail.get("sandbox")),
                               seed=inj.seed, **inj.detail))
    faulted = {v.attempt_id for v in out}
    clean: dict[str, Any] = {"attempts": 0, "trainable": 0, "collateral_inference_error": 0,
                             "unexplained": []}
    for t in trajs:
        planned = schedule.planned(t.seed)
        vkind = task_id_kind(t.task_id)
        if vkind is not None:
            out.append(verdict(vkind, t))
            continue
        if planned is not None and EXPECT[planned.kind].via is Via.MODEL:
            out.append(verdict(planned.kind, t))
            continue
        if t.trajectory_id in faulted:
            continue
        clean["attempts"] += 1
        o = t.outcome
        if o is not None and o.outcome.trainable:
            clean["trainable"] += 1
        elif o is not None and o.reason.value == "inference_error" and windows:
            clean["collateral_inference_error"] += 1
        else:
            clean["unexplained"].append({"attempt_id": t.trajectory_id,
                                         "outcome": o.outcome.value if o else None,
                                         "reason": o.reason.value if o else None,
                                         "planned": planned.kind.value if planned else None})
    return out, clean
