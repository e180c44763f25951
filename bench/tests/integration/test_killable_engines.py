"""The fault campaign's engines: a restart is not failed by another engine dying meanwhile.

Regression: CI's quick campaign saw "accelsim engine ... exited during startup" from a restart
whose replacement was healthy -- the health wait looked at every engine's process, and another
engine killed by the next fault counted as this one's exit; the replacement's port was also
taken from the end of a list that a concurrent restart appended to."""

from __future__ import annotations

import asyncio

from rollbank_bench.faults.engines import KillableEngines


def test_a_restart_survives_another_engine_being_killed_meanwhile() -> None:
    async def go() -> None:
        async with KillableEngines("h100-llama3.1-8b", num_servers=2) as engines:
            old0 = engines.ports[0]
            restarting = asyncio.create_task(engines.restart(0))
            await asyncio.sleep(0.05)  # restart(0) is waiting for its replacement's health
            engines.kill(1)
            await engines.procs[1].wait()
            _host, port = await restarting
            assert port == engines.ports[0] != old0
            assert engines.procs[0].returncode is None
            # and two restarts at once each get their own replacement
            a, b = await asyncio.gather(engines.restart(0), engines.restart(1))
            assert [a[1], b[1]] == engines.ports and a[1] != b[1]
            assert all(p.returncode is None for p in engines.procs)

    asyncio.run(go())
