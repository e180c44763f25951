"""Agent episodes wired for a collection: the gateway (built over the collection's router and
clients) and the :class:`~rollbank.agents.episode.AgentLoop` the runner is given.

``agent_plane(...)`` builds both (nothing serves yet: the runner may be built with the hook);
``async with plane.serving():`` serves the gateway on 127.0.0.1 for the collection's life
(``rollbank.gateway.serve.running``). The model's chat template comes from the model folder
(``ChatTemplate.for_model``); the in-process fake engine (``inference.kind = "fake"``) speaks
a plain ChatML template over its byte-level tokenizer.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from rollbank.agents.config import AgentConfig
from rollbank.agents.episode import AgentLoop
from rollbank.chat.template import ChatTemplate
from rollbank.clock import Clock
from rollbank.episodes.config import RunnerConfig
from rollbank.gateway.config import GatewaySection
from rollbank.gateway.gateway import Gateway
from rollbank.inference.protocol import InferenceClient, Tokenizer
from rollbank.routing.router import Router

#: The fake engine's template (its tokenizer is byte-level: any text round-trips).
FAKE_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] or '' }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@dataclass
class AgentPlane:
    gateway: Gateway
    loop: AgentLoop

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        from rollbank.gateway.serve import running

        async with running(self.gateway) as url:
            yield url


def agent_plane(config: AgentConfig, runner: RunnerConfig, *,
                clients: Mapping[str, InferenceClient], router: Router, tokenizer: Tokenizer,
                model: str | None, clock: Clock,
                gateway: GatewaySection | None = None) -> AgentPlane:
    """``model``: the model name or folder whose chat template the gateway renders (None: the
    fake engine)."""
    template = ChatTemplate.for_model(model) if model is not None else \
        ChatTemplate(FAKE_CHATML, name="fake-chatml", use_transformers=False)
    served = model or "fake"
    gw = Gateway(clients, router, tokenizer, template, model=served, clock=clock,
                 config=gateway, eos_token_id=tokenizer.eos_token_id)
    loop = AgentLoop(config, gw, model=gw.model, step_timeout_s=runner.step_timeout_s,
                     max_model_len=runner.max_model_len, min_new_tokens=runner.min_new_tokens,
                     clock=clock)
    return AgentPlane(gw, loop)
