"""close_quietly: the sandbox is closed whatever happens to the shell's close."""

from __future__ import annotations

import asyncio

import pytest

from rollbank.episodes.tools import ToolExecutor, close_quietly
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.protocol import SandboxSpec


async def test_a_cancel_during_the_shell_close_still_closes_the_sandbox() -> None:
    entered, hold = asyncio.Event(), asyncio.Event()

    async def hanging_close() -> None:  # a frozen sandbox's shell takes seconds to exit
        entered.set()
        await hold.wait()

    backend = FakeBackend(shell_close=hanging_close)
    sb = await backend.start(SandboxSpec(layers=()))
    executor = ToolExecutor(sb, step_timeout_s=5.0)
    executor._session = await sb.shell()  # as after the episode's first command
    task = asyncio.create_task(close_quietly(executor, sb))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not backend.live
    hold.set()


async def test_a_failing_shell_close_still_closes_the_sandbox() -> None:
    async def broken_close() -> None:
        raise OSError("shell pipe gone")

    backend = FakeBackend(shell_close=broken_close)
    sb = await backend.start(SandboxSpec(layers=()))
    executor = ToolExecutor(sb, step_timeout_s=5.0)
    executor._session = await sb.shell()
    await close_quietly(executor, sb)
    assert not backend.live
