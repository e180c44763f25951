"""Shared fakes for the agent-hook tests (not a test module): a fake gateway that records
model calls the way ``rollbank.gateway`` does (``SessionRecord.tokens``), and a rig wiring an
:class:`EpisodeRunner` with an :class:`AgentLoop` to fake sandboxes.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from episode_rig import TOK, FileVerifier, Recorder, fake_spec, make_task

from rollbank.agents.config import AgentConfig
from rollbank.agents.contract import LLM, AgentFn
from rollbank.agents.episode import AgentLoop
from rollbank.agents.session import AgentGateway
from rollbank.agents.verdict import GatewayHealth
from rollbank.clock import FakeClock
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.harnesses import FencedShellHarness
from rollbank.episodes.runner import EpisodeRunner
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.trajectory import Trajectory
from rollbank.gateway.records import RequestRecord, RequestTimings, SessionRecord
from rollbank.gateway.sessions import SessionHandle, SlotFactory
from rollbank.inference.fake import make_fake_fleet
from rollbank.routing.factory import make_router
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec


@dataclass
class FakeSession:
    handle: SessionHandle
    requests: list[RequestRecord] = field(default_factory=list)
    tokens: dict[str, list[Any]] = field(default_factory=lambda: {
        "token_ids": [], "logprobs": [], "loss_mask": [], "versions": []})
    rejected: int = 0
    closed: bool = False


class FakeGateway:
    """Sessions by key; ``call`` is a model request the way the gateway records one."""

    def __init__(self, *, healthy: bool = True) -> None:
        self.healthy = healthy
        self.sessions: dict[str, FakeSession] = {}
        self.closed: list[SessionRecord] = []
        self.probes = 0
        self._ids = itertools.count()

    def open_session(self, attempt_id: str, group_id: str, *, model: str | None = None,
                     slot: SlotFactory | None = None) -> SessionHandle:
        sid = f"s{next(self._ids)}"
        h = SessionHandle(sid, attempt_id, group_id, model or "m", f"http://gw/s/{sid}/v1",
                          f"key-{sid}")
        self.sessions[h.api_key] = FakeSession(h)
        return h

    async def close_session(self, session: SessionHandle | str) -> SessionRecord:
        key = session.api_key if isinstance(session, SessionHandle) else session
        s = self.sessions[key]
        s.closed = True
        rec = SessionRecord(s.handle.session_id, s.handle.attempt_id, s.handle.group_id,
                            s.handle.model, 0.0, 0.0, list(s.requests),
                            [{"index": 0, "start": 0}] if s.requests else [],
                            {k: list(v) for k, v in s.tokens.items()}, [], [], s.rejected)
        self.closed.append(rec)
        return rec

    def call(self, llm: LLM, prompt: str, answer: str, *, status: str = "ok",
             version: int = 3) -> RequestRecord:
        s = self.sessions[llm.api_key]
        if s.closed:
            raise PermissionError("401: the session is closed")
        held = s.tokens["token_ids"]
        pids = held + TOK.encode(prompt)
        out = TOK.encode(answer) if status == "ok" else []
        r = RequestRecord(f"r{next(self._ids)}", "chat", llm.model, False, {},
                          RequestTimings(time.monotonic(), total_s=0.01), status=status,  # type: ignore[arg-type]
                          segment=0, prompt_token_ids=pids, output_token_ids=out,
                          logprobs=[-0.5] * len(out), token_versions=[version] * len(out),
                          text=answer if status == "ok" else "", server="fake-0",
                          error=None if status == "ok" else "inference failed: connection reset")
        s.requests.append(r)
        if status == "ok":
            new = pids[len(held):]
            s.tokens["token_ids"] += new + out
            s.tokens["logprobs"] += [0.0] * len(new) + r.logprobs
            s.tokens["loss_mask"] += [0] * len(new) + [1] * len(out)
            s.tokens["versions"] += [-1] * len(new) + r.token_versions
        return r

    def reject(self, llm: LLM) -> None:
        self.sessions[llm.api_key].rejected += 1

    async def probe(self, llm: LLM, timeout_s: float) -> GatewayHealth:
        self.probes += 1
        return GatewayHealth(self.healthy, 0.01, "" if self.healthy else "HTTP 502: engine down")


@dataclass
class AgentRig:
    runner: EpisodeRunner
    backend: FakeBackend
    gateway: AgentGateway
    verifier: FileVerifier
    recorded: list[Trajectory]

    async def run(self, slot: int = 0) -> Trajectory:
        key = AttemptKey(seq=0, slot=slot, retry=0, group_id="g0")
        return await self.runner.run(AttemptSpec(key=key, task_id="hello", seed=7 + slot,
                                                 group_size=2, launched_at=0.0))


@contextlib.asynccontextmanager
async def agent_rig(entry: AgentFn, *, gateway: AgentGateway | None = None,
                    backend: FakeBackend | None = None, timeout_s: float = 60.0,
                    options: dict[str, str | int | float | bool] | None = None,
                    **cfg: Any) -> AsyncIterator[AgentRig]:
    """``gateway``: a :class:`FakeGateway` (its probe is used) or a real one (HTTP probe)."""
    backend = backend or FakeBackend(files={"/app/.keep": b""})
    gateway = gateway or FakeGateway()
    _, clients = make_fake_fleet(1, responder=lambda req: "")
    config = RunnerConfig(**cfg)
    loop = AgentLoop(AgentConfig(entry="tests:unused", timeout_s=timeout_s,
                                 options=options or {}), gateway,
                     model="fake-model", step_timeout_s=config.step_timeout_s,
                     max_model_len=config.max_model_len, min_new_tokens=config.min_new_tokens,
                     entry=entry,
                     gateway_probe=gateway.probe if isinstance(gateway, FakeGateway) else None)
    async with WarmPool(backend) as pool:
        recorded: list[Trajectory] = []
        verifier = FileVerifier()
        runner = EpisodeRunner(
            config, tasks={"hello": make_task()}, source=WarmSource(pool, fake_spec(("l",))),
            verifier=verifier, harness=FencedShellHarness(), tokenizer=TOK,
            clients={c.base_url: c for c in clients},
            router=make_router("round_robin", [c.base_url for c in clients], FakeClock()),
            recorder=Recorder(recorded), agent=loop)
        yield AgentRig(runner, backend, gateway, verifier, recorded)
