"""Integration tests: no blocking call on the event loop.

Every async integration test's event loop (function- or module-scoped) is created by
:func:`_debug_loop` through pytest-asyncio's ``pytest_asyncio_loop_factories`` hook: asyncio
debug mode with ``slow_callback_duration`` = :data:`SLOW_CALLBACK_S`. A callback or task
step that holds the loop longer (asyncio logs "Executing <...> took X seconds") during a test,
its fixtures' set-up or their teardown, fails that test with the offending callbacks listed.
``ROLLBANK_SLOW_CALLBACK_S`` overrides the threshold (a much slower host). Exempt: tests
marked ``vllm`` (the real-vLLM tests were not measured under this rule; their loops are plain)
and tests marked ``allow_slow_callbacks`` (say why in the marker's reason).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

SLOW_CALLBACK_S = float(os.environ.get("ROLLBANK_SLOW_CALLBACK_S", "0.25"))


class _DebugLoop(asyncio.SelectorEventLoop):
    """The default loop, kept in debug mode (pytest-asyncio's runner resets debug to its
    ``--asyncio-debug`` option after creating the loop)."""

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
        if isinstance(record.msg, str) and record.msg.startswith("Executing "):
            self.slow.append(record.getMessage()[:300])


_HANDLER = _SlowCallbacks()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "allow_slow_callbacks(reason): exempt a test from the slow-callback rule"
    )
    logging.getLogger("asyncio").addHandler(_HANDLER)


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
