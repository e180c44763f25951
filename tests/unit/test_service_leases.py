"""The batch lease state machine (service/leases.py): pure, time from a FakeClock."""

from __future__ import annotations

import pytest

from rollbank.clock import FakeClock
from rollbank.errors import ServiceError
from rollbank.service.leases import BatchLeases, BatchState


def _leases(lease_s: float = 10.0) -> tuple[FakeClock, BatchLeases]:
    clock = FakeClock()
    return clock, BatchLeases(clock, lease_s=lease_s)


def test_batches_are_leased_in_order_and_not_twice_while_leased() -> None:
    _, m = _leases()
    assert m.lease() is None
    m.add(1, "/b/1")
    m.add(0, "/b/0")
    first, second = m.lease(), m.lease()
    assert first is not None and second is not None
    assert (first.batch_index, second.batch_index) == (0, 1)
    assert first.delivery == 1 and first.path == "/b/0" and first.expires_at == 10.0
    assert m.lease() is None
    assert m.counts()["leased"] == 2 and m.counts()["ready"] == 0


def test_acked_batch_is_never_offered_again_even_after_its_lease_time() -> None:
    clock, m = _leases()
    m.add(0, "/b/0")
    lease = m.lease()
    assert lease is not None
    assert m.ack(0, lease.lease_id) is True
    clock.advance(1000)
    assert m.lease() is None
    assert m.state_of(0) is BatchState.ACKED
    assert m.ack(0, lease.lease_id) is False  # a retried ack is answered, not an error
    assert m.counts() == {"written": 1, "ready": 0, "leased": 0, "acked": 1, "unacked": 0,
                          "redeliveries": 0, "expired": 0, "released": 0}
    assert m.all_acked


def test_unacked_batch_is_offered_again_after_the_lease_time_only() -> None:
    clock, m = _leases(lease_s=10)
    m.add(0, "/b/0")
    first = m.lease()
    assert first is not None
    clock.advance(9.9)
    assert m.lease() is None  # still leased
    assert m.next_expiry() == 10.0
    clock.advance(0.1)
    again = m.lease()
    assert again is not None and again.batch_index == 0
    assert again.delivery == 2 and again.lease_id != first.lease_id and again.expires_at == 20.0
    assert m.counts()["redeliveries"] == 1 and m.counts()["expired"] == 1
    # the first consumer's ack comes too late: someone else holds the batch now
    with pytest.raises(ServiceError) as err:
        m.ack(0, first.lease_id)
    assert err.value.status == 409
    assert m.ack(0, again.lease_id) is True


def test_late_ack_is_accepted_while_nobody_else_leased_the_batch() -> None:
    clock, m = _leases(lease_s=10)
    m.add(0, "/b/0")
    lease = m.lease()
    assert lease is not None
    clock.advance(30)
    assert m.state_of(0) is BatchState.READY  # expired: available again
    assert m.ack(0, lease.lease_id) is True  # but its latest lease may still acknowledge it
    assert m.lease() is None


def test_reoffered_batch_comes_before_newer_ones() -> None:
    clock, m = _leases(lease_s=5)
    m.add(0, "/b/0")
    assert m.lease() is not None
    m.add(1, "/b/1")
    clock.advance(5)
    nxt = m.lease()
    assert nxt is not None and nxt.batch_index == 0 and nxt.delivery == 2


def test_release_offers_the_batch_at_once_and_voids_the_lease() -> None:
    _, m = _leases()
    m.add(0, "/b/0")
    lease = m.lease()
    assert lease is not None
    m.release(0, lease.lease_id)
    with pytest.raises(ServiceError) as err:
        m.ack(0, lease.lease_id)
    assert err.value.status == 409
    again = m.lease()
    assert again is not None and again.delivery == 2
    assert m.counts()["released"] == 1
    m.ack(0, again.lease_id)
    with pytest.raises(ServiceError) as err:
        m.release(0, again.lease_id)
    assert err.value.status == 409


def test_unknown_batch_and_wrong_lease_are_refused() -> None:
    _, m = _leases()
    with pytest.raises(ServiceError) as err:
        m.ack(3, "x")
    assert err.value.status == 404
    m.add(0, "/b/0")
    with pytest.raises(ServiceError) as err:
        m.ack(0, "never-issued")  # not leased yet
    assert err.value.status == 409
    with pytest.raises(ValueError):
        m.add(0, "/b/0")
    with pytest.raises(ValueError):
        BatchLeases(FakeClock(), lease_s=0)


def test_unacked_counts_leased_and_ready() -> None:
    _, m = _leases()
    for i in range(3):
        m.add(i, f"/b/{i}")
    lease = m.lease()
    assert lease is not None
    assert m.unacked == 3
    m.ack(lease.batch_index, lease.lease_id)
    assert m.unacked == 2 and not m.all_acked
