"""The fake :class:`~rollbank.inference.protocol.InferenceClient` over a fake server.

Re-exported by :mod:`rollbank.inference.fake`; the server is ``fake_server.py``.
"""

from __future__ import annotations

from rollbank.errors import ServerUnreachableError
from rollbank.inference.fake_server import FakeInferenceServer
from rollbank.inference.protocol import (
    AdmissionGate,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    ServerMetrics,
)


class FakeInferenceClient:
    """:class:`InferenceClient` over a :class:`FakeInferenceServer` (several may share one).

    ``unreachable = True`` makes every call raise :class:`ServerUnreachableError`, to test
    how callers handle a server that went away. Like the real clients, :meth:`generate` waits
    on the admission gate before the request reaches the server.
    """

    def __init__(self, server: FakeInferenceServer, *, admission: AdmissionGate | None = None) -> None:
        self.server = server
        self.unreachable = False
        self.closed = False
        self._admission = admission or AdmissionGate()

    def _check(self) -> None:
        if self.closed:
            raise RuntimeError("FakeInferenceClient is closed")
        if self.unreachable:
            raise ServerUnreachableError("connection refused (fake)", server=self.server.base_url)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def policy_version(self) -> int:
        return self.server.policy_version

    @property
    def admission(self) -> AdmissionGate:
        return self._admission

    def set_admission(self, gate: AdmissionGate) -> None:
        self._admission = gate

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self._check()
        await self._admission.wait_open()
        self._check()
        return await self.server.generate(request)

    async def abort(self, request_id: str) -> None:
        self._check()
        self.server.abort(request_id)

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None:
        self._check()
        await self.server.pause(mode, clear_cache=clear_cache)

    async def resume(self) -> None:
        self._check()
        self.server.resume()

    async def is_paused(self) -> bool:
        self._check()
        return self.server.is_paused

    async def reset_prefix_cache(self, *, attempts: int = 20, reset_running_requests: bool = False) -> None:
        self._check()
        self.server.reset_prefix_cache()

    async def engine_version(self, request_id: str | None = None) -> int:
        """The version the fake engine names (what a publication's record reads back)."""
        self._check()
        return self.server.policy_version

    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        self._check()
        self.server.reload_weights(weights_path, version=version)

    async def load_lora(self, name: str, path: str) -> None:
        self._check()
        self.server.load_lora(name, path)

    async def unload_lora(self, name: str) -> None:
        self._check()
        self.server.unload_lora(name)

    async def health(self) -> bool:
        if self.closed or self.unreachable:
            return False
        return not self.server.is_dead

    async def metrics(self) -> ServerMetrics:
        self._check()
        return self.server.metrics()

    async def aclose(self) -> None:
        self.closed = True

