"""The campaign's engine processes: accel-sim (a benchmark instrument) that can be killed.

The campaign runs on 2 cores next to real sandboxes and verifiers, so its engines are
:mod:`rollbank_bench.accelsim` processes: real separate HTTP server processes speaking vLLM's
API (token ids, log-probs, weight versions) at almost no CPU. :class:`KillableEngines` adds
what the fault campaign needs: SIGKILL one engine's process group mid-request, and start a
replacement (on a new port: the fault proxy follows it).
"""

from __future__ import annotations

import contextlib
import os
import signal

from rollbank_bench.accelsim.process import AccelSimServers


class KillableEngines(AccelSimServers):
    async def __aenter__(self) -> KillableEngines:
        await super().__aenter__()
        return self

    def kill(self, i: int) -> None:
        """SIGKILL engine ``i``'s process group (what an OOM killer or a crash does)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.procs[i].pid, signal.SIGKILL)

    async def restart(self, i: int) -> tuple[str, int]:
        """Reap engine ``i`` and start a healthy replacement; its new ``(host, port)``."""
        self.kill(i)
        await self.procs[i].wait()
        # placed at i before any other await: restarts of other engines run concurrently
        port, proc = await self._spawn(i)
        self.ports[i], self.procs[i] = port, proc
        await self._wait_healthy(self.urls[i], proc)
        return self.host, port
