"""Integration tests: no blocking call on the event loop.

Every async integration test's event loop (function- or module-scoped) is created by
:func:`_debug_loop` through pytest-asyncio's ``pytest_asyncio_loop_factories`` hook: asyncio
debug mode with ``slow_callback_duration`` = :data:`SLOW_CALLBACK_S`. A callback or task
step that holds the loop longer (asyncio logs "Executing <...> took X seconds") during a test,
its fixtures' set-up or their teardown, fails that test with the offending callbacks listed.
``ROLLBANK_SLOW_CALLBACK_S`` overrides the threshold (default 1 s: the blocking calls this
rule exists for slept for 1-10 s; 0.25 s flaked on a host at load average ~20, where even the
CPU-wait correction below leaves a few 0.3-0.4 s task steps).

Like the sandbox's billing (``rollbank.sandbox.billing``), a host stall is not charged: time
the loop's thread spent runnable but waiting for a CPU (``/proc/thread-self/schedstat``,
read when the loop wakes up and when asyncio reports the callback) is subtracted from the
callback's duration, so a loaded host (this one runs ~20 busy processes on 2 cores) does not
turn a 5 ms callback into a failure; nor is a garbage-collection pause (``gc.callbacks``;
by the end of the suite the heap holds torch and an in-process engine, and a full
collection stops every thread for over a second). CPU the callback used or a sleep it made
still counts.
Ignored: ``BaseEventLoop.shutdown_default_executor`` (Python 3.11 joins its helper thread on
the loop when pytest-asyncio closes the loop; not rollbank code). Exempt: tests
marked ``vllm`` (the real-vLLM tests were not measured under this rule; their loops are plain)
and tests marked ``allow_slow_callbacks`` (say why in the marker's reason).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import selectors
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from rollbank.sandbox.local.backend import LocalBackend

SLOW_CALLBACK_S = float(os.environ.get("ROLLBANK_SLOW_CALLBACK_S", "1.0"))


def _runqueue_wait_s() -> float:
    """Seconds this process's threads have waited for a CPU while runnable (the loop
    thread, and worker threads it may wait for, e.g. while one starts for
    ``asyncio.to_thread``); 0 if unavailable."""
    total = 0
    for task in os.scandir("/proc/self/task"):
        try:
            with open(f"{task.path}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


class _GcPauses:
    """Seconds the interpreter spent in garbage collection (``gc.callbacks``), summed: a
    full collection of the suite's heap (torch, transformers, an in-process vLLM engine by
    the end of a run) stops every thread for over a second, which is not a blocking call."""

    total = 0.0
    _started = 0.0

    @classmethod
    def callback(cls, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            cls._started = time.perf_counter()
        else:
            cls.total += time.perf_counter() - cls._started


gc.callbacks.append(_GcPauses.callback)


class _WakeMarkingSelector(selectors.DefaultSelector):
    """Notes the thread's run-queue wait and the GC pause total each time the loop wakes up
    (before callbacks)."""

    wait_at_wake = 0.0
    gc_at_wake = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(timeout)
        _WakeMarkingSelector.wait_at_wake = _runqueue_wait_s()
        _WakeMarkingSelector.gc_at_wake = _GcPauses.total
        return ready


class _DebugLoop(asyncio.SelectorEventLoop):
    """The default loop, kept in debug mode (pytest-asyncio's runner resets debug to its
    ``--asyncio-debug`` option after creating the loop)."""

    def __init__(self) -> None:
        super().__init__(_WakeMarkingSelector())

    def set_debug(self, enabled: bool) -> None:
        super().set_debug(True)


def _debug_loop() -> asyncio.AbstractEventLoop:
    loop = _DebugLoop()
    loop.slow_callback_duration = SLOW_CALLBACK_S
    return loop


def _exempt(item: pytest.Item) -> bool:
    return bool(item.get_closest_marker("vllm") or item.get_closest_marker("allow_slow_callbacks"))


class _SlowCallbacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.slow: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not (isinstance(record.msg, str) and record.msg.startswith("Executing ")):
            return
        if "shutdown_default_executor" in record.getMessage():
            return  # the stdlib's own thread.join() at loop close (Python 3.11), not our code
        took = record.args[-1] if isinstance(record.args, tuple) and record.args else None
        stalled = _runqueue_wait_s() - _WakeMarkingSelector.wait_at_wake
        gc_s = _GcPauses.total - _WakeMarkingSelector.gc_at_wake
        if isinstance(took, float) and took - stalled - gc_s < SLOW_CALLBACK_S:
            return  # slow only because the host did not give the thread a CPU, or a GC ran
        self.slow.append(f"{record.getMessage()[:300]} (host stall {stalled:.3f} s, "
                         f"GC {gc_s:.3f} s)")


_HANDLER = _SlowCallbacks()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "allow_slow_callbacks(reason): exempt a test from the slow-callback rule"
    )
    logging.getLogger("asyncio").addHandler(_HANDLER)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collection imported (torch, transformers, vLLM: ~650k objects) out of the
    collector's reach: a full collection then scans only what tests allocate."""
    gc.freeze()


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, Any]:
    return {"plain": asyncio.new_event_loop} if _exempt(item) else {"debug": _debug_loop}


@pytest.fixture(autouse=True)
def _no_slow_callbacks(request: pytest.FixtureRequest) -> Iterator[None]:
    _HANDLER.slow.clear()
    yield
    slow, _HANDLER.slow = _HANDLER.slow, []
    if slow and not _exempt(request.node):
        pytest.fail(
            f"{len(slow)} callback(s) blocked the event loop > {SLOW_CALLBACK_S} s:\n"
            + "\n".join(slow[:10]),
            pytrace=False,
        )


# ------------------------------------------------------------ shared real-sandbox fixtures
# (a test module may define its own ``base`` / ``backend`` to override these)
@pytest.fixture(scope="module")
def base() -> Path:
    """The Ubuntu 24.04 base rootfs (built once, cached by content hash)."""
    from rollbank.tasks.bases import ensure_base

    return ensure_base("ubuntu:24.04").path


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    """A real bubblewrap backend with its run directory in the test's tmp dir, closed after."""
    from rollbank.sandbox.local.backend import LocalBackend
    from rollbank.sandbox.local.config import LocalSandboxConfig

    be = LocalBackend(LocalSandboxConfig(run_dir=tmp_path / "run"))
    try:
        yield be
    finally:
        await be.aclose()
