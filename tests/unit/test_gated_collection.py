"""The staleness gate wired into collection, with fakes: scoring before release, a dropped
slot re-run like an infra retry (the group stays complete), exclusion after the re-run
limit, rare successes kept with a weight, decisions in the events and the batch columns."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from rollbank.batching.batch import Batch
from rollbank.batching.loader import batch_tensors
from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.drivers.driver import CollectionDriver
from rollbank.scheduling.drivers.fake import FakeAttemptRunner, FakePlan, make_trajectory
from rollbank.scheduling.drivers.gated_driver import collection_driver
from rollbank.scheduling.drivers.scoring import FakeScorer
from rollbank.scheduling.policy.events import AttemptWaste, EventKind, ListSink, WasteReason
from rollbank.scheduling.policy.gating import AttemptGated, StalenessGating
from rollbank.scheduling.policy.ledger import AttemptState
from rollbank.scheduling.policy.ready_bank import ReadyBank
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.scores import GroupScores
from rollbank.scheduling.policy.types import AttemptSpec
from rollbank.staleness.config import CollectionGateConfig, GateConfig, StalenessConfig

STALENESS = StalenessConfig(collection=CollectionGateConfig(enabled=True))


def _config(n: int = 2, **kw: Any) -> SchedulerConfig:
    return SchedulerConfig(bank=ReadyBankConfig(group_size=n), groups_per_batch=1, pool_groups=1,
                           sandbox_slots=4, num_batches=1, **kw)


def _plan(success_slots: Sequence[int]) -> Callable[[AttemptSpec], FakePlan]:
    def plan(spec: AttemptSpec) -> FakePlan:
        ok = spec.slot in success_slots
        return FakePlan(Reason.VERIFIED_PASS if ok else Reason.VERIFIED_FAIL, reward=float(ok))
    return plan


def _shifted(stale: Callable[[Trajectory], bool], shift: float) -> Callable[[Trajectory], list[float]]:
    """Current log-probs: the behaviour ones, ``shift`` nats lower on model tokens of stale
    trajectories (exactly equal on the others)."""
    def current(t: Trajectory) -> list[float]:
        d = shift if stale(t) else 0.0
        return [lp + d if m else 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True)]
    return current


async def _run(driver: CollectionDriver) -> list[Batch]:
    out: list[Batch] = []
    async with contextlib.aclosing(driver.batches()) as batches:
        async for b in batches:
            out.append(b)
    return out


def _gated(sink: ListSink) -> list[AttemptGated]:
    return [e for e in sink.events if isinstance(e, AttemptGated)]


async def test_a_dropped_slot_is_rerun_and_the_group_stays_complete() -> None:
    clock, sink = FakeClock(), ListSink()
    runner = FakeAttemptRunner(_plan([0]), clock)
    scorer = FakeScorer(_shifted(lambda t: t.attempt == 1 and t.retry == 0, -0.5), version=3)
    driver = collection_driver(_config(), runner, ["a"], scorer=scorer, staleness=STALENESS,
                               sink=sink, clock=clock)
    [batch] = await _run(driver)
    # the stale attempt was replaced in its slot: the group is complete with both slots
    [group] = batch.groups
    assert [t.trajectory_id for t in group.trajectories] == ["g00000/s0/r0", "g00000/s1/r1"]
    assert group.retries == 1 and len(group.advantages) == 2
    assert runner.started == ["g00000/s0/r0", "g00000/s1/r0", "g00000/s1/r1"]
    assert scorer.calls == [("g00000/s0/r0", "g00000/s1/r0"), ("g00000/s0/r0", "g00000/s1/r1")]
    ledger = driver.scheduler.bank.ledger
    assert ledger.entries[next(k for k in ledger.entries if k.attempt_id == "g00000/s1/r0")].state \
        is AttemptState.RETRIED
    # events: the decisions, then the retry, JSONL-ready
    verdicts = [(e.attempt_id, e.verdict) for e in _gated(sink)]
    assert verdicts == [("g00000/s0/r0", "admit"), ("g00000/s1/r0", "retry"),
                        ("g00000/s0/r0", "admit"), ("g00000/s1/r1", "admit")]
    retried = [e.to_dict() for e in sink.of(EventKind.RETRIED)]
    assert [d["attempt_id"] for d in retried] == ["g00000/s1/r0"]
    stale = json.loads(json.dumps(_gated(sink)[1].to_dict()))
    assert stale["kind"] == "gated" and stale["scorer_version"] == 3
    assert stale["reasons"] == ["k3", "geo_ratio"]  # -0.5 nats on every token: k3 0.107
    # batch: the columns and the report (the retried attempt counted)
    assert batch.staleness is not None
    rows = batch.staleness.rows
    assert rows["g00000/s1/r1"]["stale_retries"] == 1 and rows["g00000/s0/r0"]["stale_retries"] == 0
    assert {r["gate_verdict"] for r in rows.values()} == {"admit"}
    assert rows["g00000/s1/r1"]["scorer_version"] == 3
    report = batch.staleness.report
    assert report is not None
    assert report["gate"]["retried"] == 1 and report["gate"]["admitted"] == 2
    assert report["gate"]["groups_with_retry"] == 1
    assert report["rare_success_choice"]["kept"] == 0
    assert report["divergence"]["tokens"]["k3"] == 0.0  # the batch holds fresh rows only
    tensors = batch_tensors(batch)
    assert tensors.gate_weight is not None and tensors.gate_weight.tolist() == [1.0, 1.0]


async def test_a_slot_still_stale_after_the_rerun_limit_is_excluded() -> None:
    clock, sink = FakeClock(), ListSink()
    staleness = StalenessConfig(collection=CollectionGateConfig(enabled=True),
                                gate=GateConfig(max_stale_retries=1))
    scorer = FakeScorer(_shifted(lambda t: t.attempt == 2, -0.5))
    driver = collection_driver(_config(n=3), FakeAttemptRunner(_plan([0]), clock), ["a"],
                               scorer=scorer, staleness=staleness, sink=sink, clock=clock)
    [batch] = await _run(driver)
    [group] = batch.groups
    assert [t.trajectory_id for t in group.trajectories] == ["g00000/s0/r0", "g00000/s1/r0"]
    waste = [e for e in sink.events if isinstance(e, AttemptWaste)
             and e.reason is WasteReason.STALE_FINAL]
    assert [e.attempt_id for e in waste] == ["g00000/s2/r1"]
    assert [e.verdict for e in _gated(sink) if e.slot == 2] == ["retry", "exclude"]
    assert batch.staleness is not None and batch.staleness.report is not None
    gate = batch.staleness.report["gate"]
    assert gate["retried"] == 1 and gate["excluded"] == 1 and gate["admitted"] == 2
    assert batch.accounting.waste_by_reason.get("stale_final") == 1
    driver.scheduler.bank.check(full=True)


async def test_the_only_success_is_kept_with_a_weight_and_reported() -> None:
    clock, sink = FakeClock(), ListSink()
    scorer = FakeScorer(_shifted(lambda t: t.attempt == 1, -0.5))
    driver = collection_driver(_config(n=3), FakeAttemptRunner(_plan([1]), clock), ["a"],
                               scorer=scorer, staleness=STALENESS, sink=sink, clock=clock)
    [batch] = await _run(driver)
    assert runner_ids(batch) == ["g00000/s0/r0", "g00000/s1/r0", "g00000/s2/r0"]
    assert batch.staleness is not None and batch.staleness.report is not None
    row = batch.staleness.rows["g00000/s1/r0"]
    assert row["gate_verdict"] == "downweight" and row["rare_success"] is True
    assert 0.1 <= row["gate_weight"] < 1.0
    choice = batch.staleness.report["rare_success_choice"]
    assert choice["keep_rare_success"] is True and choice["kept"] == 1
    assert choice["weights"] == [row["gate_weight"]]
    assert batch.staleness.report["rare_success"] == ["g00000/s1/r0"]
    assert not sink.of(EventKind.RETRIED)


def runner_ids(batch: Batch) -> list[str]:
    return [t.trajectory_id for t in batch.trajectories]


async def test_a_moderate_divergence_is_downweighted_in_the_columns() -> None:
    clock = FakeClock()
    scorer = FakeScorer(_shifted(lambda t: t.attempt == 0, -0.02))  # geo 0.980: down-weight
    driver = collection_driver(_config(), FakeAttemptRunner(_plan([0]), clock), ["a"],
                               scorer=scorer, staleness=STALENESS, clock=clock)
    [batch] = await _run(driver)
    assert batch.staleness is not None
    row = batch.staleness.rows["g00000/s0/r0"]
    assert row["gate_verdict"] == "downweight" and row["gate_reasons"] == ["geo_ratio"]
    assert abs(row["gate_weight"] - 0.98019867) < 1e-6
    assert batch.staleness.rows["g00000/s1/r0"]["gate_weight"] == 1.0


async def test_a_scorer_failure_leaves_the_group_unmeasured_and_collection_goes_on() -> None:
    clock, sink = FakeClock(), ListSink()
    scorer = FakeScorer(raises=RuntimeError("engine gone"))
    driver = collection_driver(_config(), FakeAttemptRunner(_plan([0]), clock), ["a"],
                               scorer=scorer, staleness=STALENESS, sink=sink, clock=clock)
    [batch] = await _run(driver)
    assert batch.staleness is not None
    assert {r["gate_verdict"] for r in batch.staleness.rows.values()} == {"admit"}
    assert {r["current_logprobs"] is None for r in batch.staleness.rows.values()} == {True}
    assert {e.unmeasured_why for e in _gated(sink)} == {"RuntimeError: engine gone"}
    assert driver.scoring is not None and driver.scoring.log[0][-1] == 2  # both unmeasured


def test_scores_for_a_group_aborted_while_scoring_are_ignored() -> None:
    gate = StalenessGating(STALENESS)
    bank = ReadyBank(ReadyBankConfig(group_size=2), FakeClock(), gate=gate)
    keys = bank.open_group("g", "t", 0)
    runner = FakeAttemptRunner(_plan([0]))
    for k in keys:
        bank.on_launched(k)
        spec = AttemptSpec(k, "t", 0, 2, 0.0)
        assert bank.on_finished(k, make_trajectory(spec, runner.plan_for(spec), now=0.0)) is None
    [need] = gate.drain()
    assert gate.pending == 1 and bank.remaining("g") == 0
    bank.abort_group("g")
    assert gate.on_scored(bank, "g", GroupScores(0, {}, "fake")) is None
    assert gate.pending == 0
    bank.check(full=True)
    assert len(need.trajectories) == 2


async def test_collection_driver_is_plain_unless_the_gate_is_enabled() -> None:
    runner = FakeAttemptRunner(_plan([0]))
    plain = collection_driver(_config(), runner, ["a"], staleness=StalenessConfig())
    assert plain.scoring is None and plain.scheduler.gate is None
    gated = collection_driver(_config(), runner, ["a"], staleness=STALENESS, scorer=FakeScorer())
    assert gated.scoring is not None and isinstance(gated.scheduler.gate, StalenessGating)
    assert StalenessConfig().collection.enabled is False


def test_a_gate_without_a_scorer_or_a_scorer_without_a_gate_is_refused() -> None:
    runner, clock = FakeAttemptRunner(_plan([0])), FakeClock()
    gated = Scheduler(_config(), ["a"], clock, gate=StalenessGating(STALENESS))
    with pytest.raises(ValueError, match="gate"):  # its groups would wait for scores forever
        CollectionDriver(_config(), runner, ["a"], clock=clock, scheduler=gated)
    with pytest.raises(ValueError, match="gate"):
        CollectionDriver(_config(), runner, ["a"], clock=clock, scorer=FakeScorer())
