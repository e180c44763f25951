"""The gateway seam the agent hook drives: one base URL + key per attempt
(``rollbank.gateway.gateway.Gateway`` implements it; unit tests use a fake)."""

from __future__ import annotations

from typing import Protocol

from rollbank.gateway.records import SessionRecord
from rollbank.gateway.sessions import SessionHandle, SlotFactory


class AgentGateway(Protocol):
    def open_session(self, attempt_id: str, group_id: str, *, model: str | None = None,
                     slot: SlotFactory | None = None) -> SessionHandle: ...

    async def close_session(self, session: SessionHandle | str) -> SessionRecord: ...
