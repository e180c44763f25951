"""Shared set-up of the gateway tests: fake servers, a byte-level tokenizer the chat session
accepts, a Qwen-style template with a tools slot and a ChatML one without, and an official
``openai`` client over the app (``httpx.ASGITransport``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import httpx2
from openai import AsyncOpenAI

from rollbank.chat.template import ChatTemplate
from rollbank.clock import MonotonicClock
from rollbank.gateway.app import build_app
from rollbank.gateway.config import GatewaySection
from rollbank.gateway.gateway import Gateway
from rollbank.gateway.sessions import SessionHandle
from rollbank.inference.fake import FakeInferenceServer, FakeTokenizer
from rollbank.inference.fake_client import FakeInferenceClient
from rollbank.inference.protocol import GenerateRequest
from rollbank.routing.factory import make_router

# Qwen 2.5's template shape, shortened: tools in the system turn, <tool_call> blocks.
QWEN_LIKE = (
    "{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] }}\n\n{% endif %}# Tools\n<tools>\n{% for t in tools %}"
    "{{ t | tojson }}\n{% endfor %}</tools><|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{% elif m['role'] == 'assistant' %}"
    "<|im_start|>assistant\n{{ m['content'] or '' }}{% for c in m.get('tool_calls') or [] %}"
    "\n<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": "
    "{{ c['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatFakeTokenizer(FakeTokenizer):
    """The byte-level fake with the ``skip_special_tokens`` keyword the chat session passes."""

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return super().decode(token_ids)


@dataclass
class Rig:
    gateway: Gateway
    servers: list[FakeInferenceServer]
    app: Any
    replies: list[str] = field(default_factory=list)

    def client(self, h: SessionHandle, *, base_url: str | None = None, **kw: Any) -> AsyncOpenAI:
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=self.app), base_url="http://gw")
        return AsyncOpenAI(base_url=base_url or h.base_url, api_key=h.api_key, http_client=http,
                           max_retries=0, **kw)

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://gw")

    @property
    def seen(self) -> list[GenerateRequest]:
        return [r for s in self.servers for r in s.requests_seen]


def make_rig(*, template: str | None = QWEN_LIKE, n_servers: int = 2,
             responder: Callable[[GenerateRequest], str | None] | None = None,
             config: GatewaySection | None = None, admin_token: str | None = None) -> Rig:
    replies: list[str] = []

    def scripted(req: GenerateRequest) -> str | None:
        return replies.pop(0) if replies else "ok"

    tok = ChatFakeTokenizer()
    servers = [FakeInferenceServer(base_url=f"fake://s{i}", responder=responder or scripted,
                                   tokenizer=tok) for i in range(n_servers)]
    clients = {s.base_url: FakeInferenceClient(s) for s in servers}
    clock = MonotonicClock()
    router = make_router("cache_aware", list(clients), clock)
    tpl = ChatTemplate(template, name="test", use_transformers=False) if template else None
    gw = Gateway(clients, router, tok, tpl, model="fake-model", clock=clock, config=config,
                 eos_token_id=tok.EOS)
    gw.root_url = "http://gw"
    rig = Rig(gw, servers, build_app(gw, admin_token=admin_token), replies)
    return rig


async def call_asgi(app: Any, path: str, key: str, body: dict[str, Any],
                    hang_up: Callable[[], Awaitable[None]]) -> tuple[int, bytes]:
    """POST ``body`` to ``app`` as a raw ASGI client that hangs up (``http.disconnect``) once
    ``hang_up()`` returns, as uvicorn reports a closed connection; the status and body sent."""
    raw = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "server": ("gw", 80), "client": ("127.0.0.1", 5000),
             "headers": [(b"host", b"gw"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode()),
                         (b"authorization", f"Bearer {key}".encode())]}
    sent_body = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await hang_up()
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        nonlocal status
        if msg["type"] == "http.response.start":
            status = msg["status"]
        elif msg["type"] == "http.response.body":
            chunks.append(msg.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)
