"""The campaign's scripted agent program — a BENCHMARK INSTRUMENT, not an agent worth running.

Agent rounds of the campaign collect with ``harness = "agent"``: every attempt runs
:func:`agent` (``agent.entry = "rollbank_bench.faults.agents:agent"``) behind rollbank's real
gateway, on the campaign's accel-sim engines behind the fault proxy, in real sandboxes with the
real verifiers. The program plans its attempt from the seeded agent schedule
(:class:`.kinds.FaultSchedule` over :data:`.kinds.AGENT_KINDS`, keyed by the attempt seed read
from its attempt id) and either runs clean — one chat request, then its commands (``/app/done``
on even seeds, so groups have reward variance) — or carries its attempt's fault:

- its own doing: its process SIGKILLed after a model answer (the "process" is a host child it
  waits on, killed from outside), an exception, no model call at all, only malformed requests,
  a hang past ``agent.timeout_s``, a first prompt over the context, a history that outgrows it;
- the gateway's engine side: it arms the fault proxy for its gateway session
  (:class:`.agent_proxy.AgentFaultProxy`), whose next engine request is reset, cut mid-stream
  or answered with a malformed body; the program then gives up, as an HTTP client does after a
  failed request.

Each fault is logged in the campaign's :class:`.inject.FaultLog` with the attempt id when it
is carried out (first run of the slot only: a retry runs clean), so the campaign joins it to
the attempt's outcome as for every other kind. The rig publishes the live parts with
:func:`install` (the entry point is named by config, so it finds them there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rollbank.agents.contract import LLM, AgentProcessKilled, AgentSandbox, AgentTask
from rollbank_bench.faults.inject import FaultLog, Injection
from rollbank_bench.faults.kinds import GATEWAY_KINDS, FaultKind, FaultSchedule, Planned
from rollbank_bench.faults.tasks import task_id_kind

ENTRY = "rollbank_bench.faults.agents:agent"
#: agent.timeout_s of agent rounds: a clean agent needs well under a second of it
AGENT_TIMEOUT_S = 6.0
#: a ChatML template for the tiny model's folder (it ships none); any text round-trips
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] or '' }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
#: words whose tokens fill any context the campaign's engines have (max_model_len 4096)
OVER_CONTEXT_TEXT = " ".join(f"w{i % 97}x{i % 89}" for i in range(6000))
_AID = re.compile(r"^g(\d+)[^/]*/s(\d+)/r(\d+)$")


class Arming(Protocol):
    """The fault proxy as the agent sees it (:class:`.agent_proxy.AgentFaultProxy`)."""

    def arm(self, session_id: str, kind: FaultKind, seed: int, attempt_id: str) -> None: ...

    def disarm(self, session_id: str) -> None: ...

    def seed_of(self, seq: int, slot: int) -> int:
        """The attempt seed of ``(group seq, slot)`` in the round running now."""
        ...


@dataclass
class AgentFaults:
    """The live parts the scripted agent needs: the agent schedule, the campaign's fault log
    and the proxy (to arm, and for the round's attempt seeds)."""

    schedule: FaultSchedule
    log: FaultLog
    proxy: Arming


_CURRENT: list[AgentFaults] = []


@contextlib.contextmanager
def install(faults: AgentFaults) -> Iterator[None]:
    """Make ``faults`` what :func:`agent` reads while the block runs."""
    _CURRENT.append(faults)
    try:
        yield
    finally:
        _CURRENT.remove(faults)


def parse_attempt(attempt_id: str) -> tuple[int, int, int] | None:
    """``(group seq, slot, retry)`` of an attempt id ``g<seq>.../s<slot>/r<retry>``."""
    m = _AID.match(attempt_id)
    return None if m is None else (int(m[1]), int(m[2]), int(m[3]))


def planned_for(faults: AgentFaults, task: AgentTask) -> tuple[int, Planned | None]:
    """The attempt's seed and its fault (None: a clean run — a retry, a verifier-fault task,
    a seed already injected, or none planned)."""
    parsed = parse_attempt(task.attempt_id)
    if parsed is None:
        raise ValueError(f"not a scheduler attempt id: {task.attempt_id!r}")
    seq, slot, retry = parsed
    seed = faults.proxy.seed_of(seq, slot)
    if task_id_kind(task.task_id) is not None:  # the verifier is this attempt's fault
        faults.schedule.exempt.add(seed)
    planned = faults.schedule.planned(seed)
    if planned is None or retry != 0 or not faults.log.first(seed):
        return seed, None
    return seed, planned


def write_model_folder(root: Path, tiny: Path) -> Path:
    """The tiny model's tokenizer files with :data:`CHATML` as its chat template (what the
    gateway renders; the engines are accel-sim, no weights are read)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "generation_config.json"):
        if (tiny / name).exists():
            shutil.copyfile(tiny / name, root / name)
    cfg = json.loads((tiny / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHATML
    (root / "tokenizer_config.json").write_text(json.dumps(cfg))
    return root


class GatewayFailed(Exception):
    """The gateway answered a request with an error: the scripted agent gives up."""


async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
    """The entry point (see the module doc)."""
    faults = _CURRENT[-1]
    seed, planned = planned_for(faults, task)
    kind = planned.kind if planned is not None else None
    import httpx  # lazy, as every agent program's client

    def log(**detail: Any) -> None:
        assert kind is not None
        faults.log.add(Injection(kind, seed, task.attempt_id, detail))

    async with httpx.AsyncClient(timeout=60.0) as http:
        chat = _Chat(http, llm)
        # logged when decided: a timeout afterwards leaves the attempt without a model answer
        # all the same (no_model_call is judged before the timeout)
        if kind is FaultKind.AGENT_NO_MODEL_CALL:
            log(what="returns without a model call")
            await sandbox.exec("echo step >> /app/log")
            return
        if kind is FaultKind.AGENT_MALFORMED_REQUEST:
            log(what="two malformed requests (400), then returns")
            for bad in ({"model": llm.model, "messages": "not a list"},
                        {"model": llm.model, "messages": [{"role": "user"}], "max_tokens": -3}):
                await chat.post(bad, expect_error=True)
            return
        if kind is FaultKind.AGENT_PROMPT_OVER_CONTEXT:
            await _refused(chat, log)
        if kind in GATEWAY_KINDS:
            assert kind is not None
            session = session_of(llm)
            faults.proxy.arm(session, kind, seed, task.attempt_id)
            try:
                await chat.ask(task.instruction, stream=kind is FaultKind.GATEWAY_STREAM_CUT,
                               max_tokens=32 if kind is FaultKind.GATEWAY_STREAM_CUT else 8)
            finally:
                faults.proxy.disarm(session)
            return  # the armed request was answered: the proxy logged nothing, a clean run
        await chat.ask(task.instruction)
        if kind is FaultKind.AGENT_HANG:
            log(timeout_s=AGENT_TIMEOUT_S)
            await asyncio.sleep(3600)
        if kind is FaultKind.AGENT_CONTEXT_EXHAUSTED:
            await _refused(chat, log)
        if kind is FaultKind.AGENT_KILLED:
            await _killed_process(planned.delay_s if planned else 0.5, log)
        await sandbox.exec("echo step >> /app/log" + ("; touch /app/done" if seed % 2 == 0 else ""))
        if kind is FaultKind.AGENT_RAISED:
            log(what="raised after a model answer and a command")
            raise RuntimeError("scripted agent: cannot parse the model's answer (injected)")


def session_of(llm: LLM) -> str:
    """The gateway session id in the attempt's base URL (``.../s/<session>/v1``)."""
    parts = llm.base_url.rstrip("/").split("/")
    return parts[parts.index("s") + 1]


class _Chat:
    def __init__(self, http: Any, llm: LLM) -> None:
        self.http, self.llm = http, llm
        self.messages: list[dict[str, str]] = []

    async def post(self, body: dict[str, Any], *, expect_error: bool = False) -> Any:
        r = await self.http.post(f"{self.llm.base_url}/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {self.llm.api_key}"})
        if r.status_code != 200 and not expect_error:
            raise GatewayFailed(f"HTTP {r.status_code}: {r.text[:200]}")
        return r

    async def ask(self, text: str, *, stream: bool = False, max_tokens: int = 8) -> str:
        self.messages.append({"role": "user", "content": text})
        body = {"model": self.llm.model, "messages": self.messages, "max_tokens": max_tokens,
                "temperature": 1.0, "stream": stream}
        if stream:
            answer = await self._stream(body)
        else:
            r = await self.post(body)
            answer = r.json()["choices"][0]["message"]["content"] or ""
        self.messages.append({"role": "assistant", "content": answer})
        return answer

    async def _stream(self, body: dict[str, Any]) -> str:
        parts: list[str] = []
        async with self.http.stream("POST", f"{self.llm.base_url}/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {self.llm.api_key}"}) as r:
            if r.status_code != 200:
                raise GatewayFailed(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            done = False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise GatewayFailed(f"stream error: {chunk['error']}")
                for c in chunk.get("choices", []):
                    parts.append((c.get("delta") or {}).get("content") or "")
            if not done:
                raise GatewayFailed("the stream ended without [DONE]")
        return "".join(parts)


async def _refused(chat: _Chat, log: Callable[..., None]) -> None:
    """Send :data:`OVER_CONTEXT_TEXT` (logged first: a timeout while it is refused leaves the
    same verdict family — no answer yet: infra; after an answer: the model's timeout), then
    give up on the refusal."""
    log(prompt_chars=len(OVER_CONTEXT_TEXT))
    await chat.ask(OVER_CONTEXT_TEXT)
    raise AssertionError("the engine answered a prompt over its context")


async def _killed_process(delay_s: float, log: Callable[..., None]) -> None:
    """The agent's own process (a host child it waits on) SIGKILLed from outside after
    ``delay_s``; raises :class:`AgentProcessKilled` as a process-running entry point does.
    Logged with no await before the raise: a kill the agent's timeout pre-empted (the loop
    cancels it while it waits) is no injected fault."""
    proc = await asyncio.create_subprocess_exec("sleep", "30")
    try:
        await asyncio.sleep(delay_s)
        proc.send_signal(signal.SIGKILL)
        rc = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    log(signal="SIGKILL", pid=proc.pid, returncode=rc)
    raise AgentProcessKilled(-rc, "the scripted agent's process")
