"""Property: with the staleness gate, every launched attempt is still accounted for exactly
once, whatever the order of completions and of scores (some arriving after their group was
aborted), and every batch row is a kept verdict with its columns.

Hypothesis draws the configuration (straggler policy, group size, re-run limits) and a
random schedule; the pure :class:`Scheduler` with the staleness gate is stepped to the end and closed.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig, StragglerPolicy
from rollbank.scheduling.drivers.fake import FakePlan, make_trajectory
from rollbank.scheduling.policy.events import EventKind
from rollbank.scheduling.policy.gating import AttemptGated, StalenessGating
from rollbank.scheduling.policy.group_gate import NeedsScoring
from rollbank.scheduling.policy.ledger import AttemptState
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.scores import GroupScores
from rollbank.scheduling.policy.types import (
    AttemptKey,
    AttemptSpec,
    EmitBatch,
    Launch,
)
from rollbank.staleness.config import CollectionGateConfig, GateConfig, StalenessConfig

OUTCOMES = [(Reason.VERIFIED_PASS, 1.0), (Reason.VERIFIED_FAIL, 0.0), (Reason.SANDBOX_DIED, None)]
SHIFTS = [0.0, 0.0, -0.02, -0.5, None]  # admit, admit, down-weight, drop, unmeasured


def _scores(need: NeedsScoring, rng: random.Random) -> GroupScores:
    out: dict[str, list[float] | None] = {}
    for t in need.trajectories:
        shift = rng.choice(SHIFTS)
        out[t.trajectory_id] = None if shift is None else [
            lp + shift if m else 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True)]
    return GroupScores(1, out, "fake")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(2, 4),
       straggler=st.sampled_from(list(StragglerPolicy)), stale_retries=st.integers(0, 2),
       admit_unmeasured=st.booleans())
def test_gated_scheduler_accounts_every_attempt_once(
        seed: int, n: int, straggler: StragglerPolicy, stale_retries: int,
        admit_unmeasured: bool) -> None:
    rng = random.Random(seed)
    clock = FakeClock()
    config = SchedulerConfig(bank=ReadyBankConfig(group_size=n, max_retries=1), groups_per_batch=2,
                             pool_groups=3, sandbox_slots=3, num_batches=3, straggler=straggler,
                             max_requeues=1)
    staleness = StalenessConfig(
        collection=CollectionGateConfig(enabled=True),
        gate=GateConfig(max_stale_retries=stale_retries, admit_unmeasured=admit_unmeasured))
    s = Scheduler(config, ["a", "b"], clock, gate=StalenessGating(staleness))
    running: dict[AttemptKey, AttemptSpec] = {}
    pending: list[NeedsScoring] = []
    batches = []
    rows_of_batches: list[tuple[str, dict[str, object]]] = []
    for _ in range(2000):
        for d in s.poll():
            if isinstance(d, Launch):
                running[d.spec.key] = d.spec
            elif isinstance(d, EmitBatch):
                batches.append(d.batch)
                assert d.batch.staleness is not None
                for t in d.batch.trajectories:
                    row = dict(d.batch.staleness.rows[t.trajectory_id])
                    assert row["gate_verdict"] in ("admit", "downweight")
                    rows_of_batches.append((t.trajectory_id, row))
                s.ack(d.batch.index)
            else:  # Abort
                running.pop(d.key, None)
                s.on_aborted(d.key)
        if s.done:
            break
        pending.extend(s.drain_scoring())
        clock.advance(1.0)
        if pending and (not running or rng.random() < 0.4):
            need = pending.pop(rng.randrange(len(pending)))
            s.on_scored(need.group_id, _scores(need, rng))
            continue
        if not running:
            break
        key = rng.choice(sorted(running))
        spec = running.pop(key)
        reason, reward = rng.choice(OUTCOMES)
        traj: Trajectory = make_trajectory(spec, FakePlan(reason, reward), now=clock.now())
        s.on_finished(key, traj)
    s.close()
    ledger = s.bank.ledger
    counts = ledger.counts()
    assert counts[AttemptState.IN_FLIGHT] == counts[AttemptState.FINISHED] == 0
    consumed = {e.key.attempt_id for e in ledger.entries.values() if e.state is AttemptState.CONSUMED}
    assert consumed == {tid for tid, _ in rows_of_batches}
    gated = [e for e in s.drain_events() if isinstance(e, AttemptGated)]
    retried_by_gate = {e.attempt_id for e in gated if e.verdict == "retry"}
    for aid in retried_by_gate:
        entry = next(e for e in ledger.entries.values() if e.key.attempt_id == aid)
        assert entry.state is AttemptState.RETRIED
    for tid, row in rows_of_batches:
        stale = row["stale_retries"]
        assert isinstance(stale, int) and 0 <= stale <= min(stale_retries, int(tid.rsplit("/r", 1)[1]))
    assert all(e.kind is EventKind.GATED for e in gated)
