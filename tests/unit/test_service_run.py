"""When `rollbank serve-collector` stops (service/run.py `_until_end`), and binding."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from rollbank.clock import MonotonicClock
from rollbank.errors import ServiceError
from rollbank.service.hub import CollectorHub
from rollbank.service.leases import BatchLeases, Lease
from rollbank.service.run import _until_end, bind
from rollbank.signals import stop_on_signals


def _hub() -> CollectorHub:
    clock = MonotonicClock()
    return CollectorHub(BatchLeases(clock, lease_s=600), run_id="r", max_unacked=4, clock=clock)


async def _finished_collection(hub: CollectorHub) -> None:
    await hub.on_batch(0, Path("/b/0"))
    await hub.finish()


async def _forever() -> None:
    await asyncio.Event().wait()


@pytest.mark.parametrize("exit_when_done", [False, True])
async def test_a_finished_collection_does_not_stop_the_service_by_itself(exit_when_done: bool) -> None:
    hub = _hub()
    collecting = asyncio.create_task(_finished_collection(hub))
    serving = asyncio.create_task(_forever())
    stopped = asyncio.Event()
    ending = asyncio.create_task(_until_end(hub, collecting, serving, stopped,
                                            exit_when_done=exit_when_done))
    await collecting
    await asyncio.sleep(0.05)
    assert not ending.done()  # one batch not acknowledged yet
    lease = await hub.next_batch(0)
    assert isinstance(lease, Lease)
    await hub.ack(0, lease.lease_id)
    await asyncio.sleep(0.05)
    assert ending.done() is exit_when_done  # exit_when_done: every batch acknowledged
    stopped.set()  # a signal always ends it
    await asyncio.wait_for(ending, 5)
    serving.cancel()


async def test_a_failed_collection_ends_the_wait() -> None:
    hub = _hub()

    async def failing() -> None:
        raise RuntimeError("boom")

    collecting = asyncio.create_task(failing())
    serving = asyncio.create_task(_forever())
    await asyncio.wait_for(_until_end(hub, collecting, serving, asyncio.Event(), exit_when_done=False), 5)
    assert isinstance(collecting.exception(), RuntimeError)
    serving.cancel()


def test_bind_refuses_a_taken_port_with_exit_code_1() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        with pytest.raises(ServiceError) as err:
            bind("127.0.0.1", taken.getsockname()[1])
        assert err.value.exit_code == 1 and "--service.port" in str(err.value)
    finally:
        taken.close()
    free = bind("127.0.0.1", 0)
    assert free.getsockname()[1] > 0
    free.close()


def test_signals_stop_the_service_from_the_main_thread_only() -> None:
    """Regression: the service installed its SIGINT/SIGTERM handlers unconditionally, and
    ``loop.add_signal_handler`` raises off the main thread ("set_wakeup_fd only works in main
    thread"): a library caller or a test running the command in a worker thread failed."""
    import os
    import signal
    import threading

    async def worker_loop() -> None:
        undo = stop_on_signals(lambda: None)  # no handler installed, no error
        undo()

    errors: list[BaseException] = []

    def worker() -> None:
        try:
            asyncio.run(worker_loop())
        except BaseException as exc:
            errors.append(exc)

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert errors == [] and signal.getsignal(signal.SIGTERM) is before

    async def main_loop() -> None:  # control: on the main thread a signal stops the service
        stopped = asyncio.Event()
        undo = stop_on_signals(stopped.set)
        try:  # (never SIGTERM this test run without the handler)
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(stopped.wait(), 60)
        finally:
            undo()

    asyncio.run(main_loop())
    assert signal.getsignal(signal.SIGTERM) is before  # handlers removed
