"""Ready bank: completion, in-slot retries, valid-only advantages, exactly-once accounting."""

from __future__ import annotations

import math

import pytest

from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.scheduling.config import ReadyBankConfig
from rollbank.scheduling.drivers.fake import FakePlan, make_trajectory
from rollbank.scheduling.policy.events import EventKind, WasteReason
from rollbank.scheduling.policy.ledger import AttemptState, LedgerError
from rollbank.scheduling.policy.ready_bank import GroupDone, GroupStatus, ReadyBank, Retry
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec


def _spec(key: AttemptKey) -> AttemptSpec:
    return AttemptSpec(key, "task", seed=0, group_size=4, launched_at=0.0)


def _finish(bank: ReadyBank, key: AttemptKey, reason: Reason, reward: float | None = None):  # type: ignore[no-untyped-def]
    if reward is None and reason in (Reason.VERIFIED_PASS, Reason.VERIFIED_FAIL):
        reward = 1.0 if reason is Reason.VERIFIED_PASS else 0.0
    return bank.on_finished(key, make_trajectory(_spec(key), FakePlan(reason, reward), now=1.0))


def _bank(**kw: object) -> tuple[ReadyBank, FakeClock]:
    clock = FakeClock()
    return ReadyBank(ReadyBankConfig(group_size=4, **kw), clock), clock  # type: ignore[arg-type]


def _launch_all(bank: ReadyBank, gid: str, seq: int) -> list[AttemptKey]:
    keys = bank.open_group(gid, "task", seq)
    for k in keys:
        bank.on_launched(k)
    return keys


def test_group_enters_only_when_every_sibling_is_terminal() -> None:
    bank, _ = _bank()
    keys = _launch_all(bank, "g0", 0)
    for k in keys[:3]:
        assert _finish(bank, k, Reason.VERIFIED_PASS) is None
        assert bank.ready_count == 0
    done = _finish(bank, keys[3], Reason.VERIFIED_FAIL)
    assert done == GroupDone("g0", True)
    assert bank.ready_count == 1
    bank.check()


def test_infra_failure_is_rerun_in_its_slot_not_discarding_the_group() -> None:
    bank, _ = _bank(max_retries=2)
    keys = _launch_all(bank, "g0", 0)
    decision = _finish(bank, keys[1], Reason.SANDBOX_DIED)
    assert isinstance(decision, Retry)
    assert (decision.key.slot, decision.key.retry, decision.key.seq) == (1, 1, 0)
    bank.on_launched(decision.key)
    for k in (keys[0], keys[2], keys[3]):
        _finish(bank, k, Reason.VERIFIED_PASS)
    assert bank.ready_count == 0  # slot 1 still running its re-run
    assert _finish(bank, decision.key, Reason.VERIFIED_FAIL) == GroupDone("g0", True)
    [group] = bank.take(1, 0)
    assert [t.retry for t in group.trajectories] == [0, 1, 0, 0]
    assert group.retries == 1
    assert bank.ledger.counts()[AttemptState.DELIVERED] == 4
    assert len(bank.ack(0)) == 4
    states = bank.ledger.counts()
    assert states[AttemptState.RETRIED] == 1 and states[AttemptState.CONSUMED] == 4
    bank.check()


def test_unknown_outcome_is_also_retried() -> None:
    bank, _ = _bank(max_retries=1)
    keys = _launch_all(bank, "g0", 0)
    assert isinstance(_finish(bank, keys[0], Reason.UNATTRIBUTED), Retry)


def test_after_the_retry_limit_the_group_completes_with_fewer_valid_siblings() -> None:
    bank, _ = _bank(max_retries=1, min_valid=2)
    keys = _launch_all(bank, "g0", 0)
    retry = _finish(bank, keys[0], Reason.INFERENCE_ERROR)
    assert isinstance(retry, Retry)
    bank.on_launched(retry.key)
    assert _finish(bank, retry.key, Reason.VERIFIER_CRASH) is None  # limit reached: terminal
    _finish(bank, keys[1], Reason.VERIFIED_PASS)
    _finish(bank, keys[2], Reason.VERIFIED_FAIL)
    assert _finish(bank, keys[3], Reason.VERIFIED_FAIL) == GroupDone("g0", True)
    [group] = bank.take(1, 0)
    assert [t.attempt for t in group.trajectories] == [1, 2, 3]
    assert group.infra_final == 1
    # the baseline is over the three valid rewards (1, 0, 0) only
    mean = 1 / 3
    std = math.sqrt(((1 - mean) ** 2 + 2 * mean**2) / 3)
    assert group.advantages[0] == pytest.approx((1 - mean) / (std + 1e-6))
    assert group.advantages[1] == pytest.approx(-mean / (std + 1e-6))
    waste = [e for e in bank.outbox if e.kind is EventKind.WASTE]
    assert [e.reason for e in waste] == [WasteReason.INFRA_FINAL]  # type: ignore[attr-defined]
    bank.check()


def test_group_with_too_few_valid_siblings_is_dropped_as_waste() -> None:
    bank, _ = _bank(max_retries=0, min_valid=3)
    keys = _launch_all(bank, "g0", 0)
    _finish(bank, keys[0], Reason.SANDBOX_START_FAILED)
    _finish(bank, keys[1], Reason.SANDBOX_START_FAILED)
    _finish(bank, keys[2], Reason.VERIFIED_PASS)
    done = _finish(bank, keys[3], Reason.VERIFIED_FAIL)
    assert isinstance(done, GroupDone) and not done.ready
    assert bank.status("g0") is GroupStatus.DROPPED
    assert bank.take(5, 0) == []
    reasons = sorted(e.waste_reason.value for e in bank.ledger.entries.values()  # type: ignore[union-attr]
                     if e.state is AttemptState.WASTE)
    assert reasons == ["group_dropped", "group_dropped", "infra_final", "infra_final"]
    bank.check()


@pytest.mark.parametrize("filter_zero", [False, True])
def test_zero_variance_groups_are_flagged_and_optionally_filtered(filter_zero: bool) -> None:
    bank, _ = _bank(filter_zero_variance=filter_zero)
    keys = _launch_all(bank, "g0", 0)
    for k in keys:
        _finish(bank, k, Reason.VERIFIED_FAIL)
    groups = bank.take(1, 0)
    if filter_zero:
        assert groups == []
        assert bank.status("g0") is GroupStatus.DROPPED
        assert bank.ledger.counts()[AttemptState.WASTE] == 4
    else:
        [g] = groups
        assert g.zero_variance and g.advantages == (0.0, 0.0, 0.0, 0.0)
    bank.check()


def test_take_hands_out_oldest_launch_first_regardless_of_completion_order() -> None:
    bank, _ = _bank()
    k0 = _launch_all(bank, "g0", 0)
    k1 = _launch_all(bank, "g1", 1)
    k2 = _launch_all(bank, "g2", 2)
    for keys in (k2, k1):  # g2 completes first, then g1; g0 never completes
        for i, k in enumerate(keys):
            _finish(bank, k, Reason.VERIFIED_PASS if i % 2 else Reason.VERIFIED_FAIL)
    assert [g.group_id for g in bank.take(1, 0)] == ["g1"]
    assert [g.group_id for g in bank.take(5, 1)] == ["g2"]
    assert bank.open_groups() == ["g0"]
    for k in k0:
        _finish(bank, k, Reason.VERIFIED_PASS)
    assert [g.group_id for g in bank.take(5, 2)] == ["g0"]
    bank.check()


def test_settling_twice_or_finishing_an_unexpected_attempt_is_an_error() -> None:
    bank, _ = _bank()
    keys = _launch_all(bank, "g0", 0)
    _finish(bank, keys[0], Reason.VERIFIED_PASS)
    with pytest.raises(LedgerError):
        _finish(bank, keys[0], Reason.VERIFIED_PASS)
    with pytest.raises(LedgerError):
        bank.ledger.settle(keys[1], AttemptState.CONSUMED, 0.0)  # in flight: only waste
    with pytest.raises(LedgerError):
        bank.on_launched(keys[0])


def test_abort_group_settles_launched_attempts_and_reports_those_in_flight() -> None:
    bank, _ = _bank()
    keys = _launch_all(bank, "g0", 0)
    _finish(bank, keys[0], Reason.VERIFIED_PASS)
    in_flight = bank.abort_group("g0")
    assert in_flight == keys[1:]
    assert bank.ledger.counts()[AttemptState.WASTE] == 4
    assert bank.status("g0") is GroupStatus.ABORTED
    bank.check()


def test_close_settles_everything_open_as_unconsumed_waste() -> None:
    bank, _ = _bank()
    _launch_all(bank, "g0", 0)
    k1 = _launch_all(bank, "g1", 1)
    for k in k1:
        _finish(bank, k, Reason.VERIFIED_PASS)
    bank.close()
    counts = bank.ledger.counts()
    assert counts[AttemptState.WASTE] == 8
    assert counts[AttemptState.IN_FLIGHT] == counts[AttemptState.FINISHED] == 0
    bank.check()


def test_a_batch_is_consumed_only_when_acknowledged_and_a_released_one_is_offered_again() -> None:
    bank, _ = _bank()
    for gid, seq in (("g0", 0), ("g1", 1)):
        for i, k in enumerate(_launch_all(bank, gid, seq)):
            _finish(bank, k, Reason.VERIFIED_PASS if i % 2 else Reason.VERIFIED_FAIL)
    assert [g.group_id for g in bank.take(1, 0)] == ["g0"]
    assert [g.group_id for g in bank.take(1, 1)] == ["g1"]
    counts = bank.ledger.counts()
    assert counts[AttemptState.DELIVERED] == 8 and counts[AttemptState.CONSUMED] == 0
    assert bank.unacknowledged() == [0, 1]
    bank.check()
    assert [g.group_id for g in bank.release(0)] == ["g0"]  # not taken: back in the bank
    assert bank.status("g0") is GroupStatus.READY and bank.ready_count == 1
    assert [g.group_id for g in bank.take(5, 2)] == ["g0"]  # offered again, first
    assert len(bank.ack(1)) == 4
    with pytest.raises(LedgerError):
        bank.ack(1)  # acknowledged twice
    with pytest.raises(LedgerError):
        bank.ack(0)  # released: no longer awaiting
    bank.check()
    returned = bank.close()  # batch 2 was never acknowledged
    assert [g.group_id for g in returned] == ["g0"]
    counts = bank.ledger.counts()
    assert counts[AttemptState.CONSUMED] == 4 and counts[AttemptState.WASTE] == 4
    assert counts[AttemptState.DELIVERED] == counts[AttemptState.FINISHED] == 0
    bank.check()
