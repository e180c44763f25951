"""Integration tests: no blocking call on the event loop.

Every async integration test runs with asyncio debug mode on and
``loop.slow_callback_duration`` set to :data:`SLOW_CALLBACK_S`; a callback or task step
that holds the loop longer ("Executing <...> took X seconds", logged by asyncio) fails the
test, with the offending callbacks listed. ``ROLLBANK_SLOW_CALLBACK_S`` overrides the
threshold (e.g. on a much slower host). Tests marked ``vllm`` are exempt: the real-vLLM tests
were not measured under this rule (see the billing branch's report); a test can also opt out
with ``@pytest.mark.allow_slow_callbacks`` and a reason.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator

import pytest

SLOW_CALLBACK_S = float(os.environ.get("ROLLBANK_SLOW_CALLBACK_S", "0.25"))


class _SlowCallbacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.slow: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith("Executing "):
            self.slow.append(record.getMessage()[:300])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "allow_slow_callbacks(reason): exempt a test from the slow-callback rule"
    )


@pytest.fixture(autouse=True)
async def _no_slow_callbacks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    node = request.node
    if node.get_closest_marker("vllm") or node.get_closest_marker("allow_slow_callbacks"):
        yield
        return
    loop = asyncio.get_running_loop()
    debug, duration = loop.get_debug(), loop.slow_callback_duration
    handler = _SlowCallbacks()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    loop.set_debug(True)
    loop.slow_callback_duration = SLOW_CALLBACK_S
    try:
        yield
    finally:
        loop.set_debug(debug)
        loop.slow_callback_duration = duration
        logger.removeHandler(handler)
    if handler.slow:
        pytest.fail(
            f"{len(handler.slow)} callback(s) blocked the event loop > {SLOW_CALLBACK_S} s:\n"
            + "\n".join(handler.slow[:10]),
            pytrace=False,
        )
