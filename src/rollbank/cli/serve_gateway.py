"""`rollbank serve-gateway`: an OpenAI-compatible gateway for your own agent program.

Starts (or connects to) the inference servers like `rollbank collect` (`--inference.kind
managed|external|fake`, `--model`), serves `/v1/chat/completions`, `/v1/completions` and
`/v1/models` on 127.0.0.1, and prints one JSON line with the URL. Sessions (one base URL and
key per agent run): `--sessions N` opens N at start and prints each one's `base_url` and
`api_key` (export them as OPENAI_BASE_URL / OPENAI_API_KEY); with
$ROLLBANK_GATEWAY_ADMIN_TOKEN set, `POST /admin/sessions` mints more and
`DELETE /admin/sessions/ID` closes one and returns its record. Records (token ids, log-probs,
versions, segments, timings) are written to `--gateway.records-dir` when sessions close and
at exit. Stops on SIGINT/SIGTERM. See docs/gateway.md. Needs `pip install 'rollbank[service]'`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import Field

from rollbank.collect_config import InferenceSection
from rollbank.config import Section
from rollbank.gateway.config import GatewaySection
from rollbank.routing.config import RouterConfig

ALIASES = {"--port": "gateway.port", "--sessions": "gateway.sessions",
           "--model": "inference.managed.model", "--servers": "inference.managed.num_servers"}


class ServeGatewayConfig(Section):
    """`rollbank serve-gateway`: the servers, the router, the gateway."""

    inference: InferenceSection = Field(default_factory=lambda: InferenceSection.model_validate({}),
                                        description="where tokens come from")
    router: RouterConfig = Field(default_factory=lambda: RouterConfig.model_validate({}),
                                 description="how requests are spread over the servers")
    gateway: GatewaySection = Field(default_factory=lambda: GatewaySection.model_validate({}),
                                    description="the gateway (address, limits, tool format)")
    max_model_len: int = Field(default=2048, ge=64, description="context length of fake servers "
                               "(managed servers: inference.managed.max_model_len)")


def register(sub: Any) -> None:
    from rollbank.cli.flags import add_config_flags

    p: argparse.ArgumentParser = sub.add_parser(
        "serve-gateway", help="an OpenAI-compatible gateway to rollbank's engines for your "
        "own agent (token-exact records per session)", description=__doc__)
    p.add_argument("--config", type=Path, help="TOML with [inference], [router], [gateway]")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted config key")
    add_config_flags(p, ServeGatewayConfig, aliases=ALIASES)
    p.set_defaults(func=run)


def config_from(args: argparse.Namespace) -> ServeGatewayConfig:
    from rollbank.cli.flags import overrides_from
    from rollbank.config import apply_overrides, read_toml, validate

    values, origins = overrides_from(args, args.set)
    data, source = ({}, "<defaults>") if args.config is None else read_toml(
        args.config, default_text="", default_name="")
    return validate(ServeGatewayConfig, apply_overrides(data, values, origins), source=source,
                    overrides=values, origins=origins)


def run(args: argparse.Namespace) -> int:
    import asyncio

    config = config_from(args)  # a bad flag fails here, before anything starts
    asyncio.run(_serve(config))
    return 0


async def _serve(config: ServeGatewayConfig) -> None:
    import asyncio
    import os

    from rollbank.chat.template import ChatTemplate
    from rollbank.clock import MonotonicClock
    from rollbank.gateway.gateway import Gateway
    from rollbank.gateway.records import SessionRecord
    from rollbank.gateway.serve import running
    from rollbank.gateway.tokens import ChatDecode
    from rollbank.inference_plane import open_inference
    from rollbank.routing.factory import router_from_config
    from rollbank.signals import stop_on_signals

    def say(line: str) -> None:
        print(json.dumps({"status": line}), flush=True)

    inf = config.inference
    model = inf.managed.model if inf.kind == "managed" else (inf.tokenizer or "fake")
    max_len = inf.managed.max_model_len if inf.kind == "managed" else config.max_model_len
    records = Path(config.gateway.records_dir) if config.gateway.records_dir else None
    if records is not None:
        records.mkdir(parents=True, exist_ok=True)
    admin = os.environ.get(config.gateway.admin_token_env) or None
    async with open_inference(inf, max_model_len=max_len, say=say) as plane:
        template = None if inf.kind == "fake" else await asyncio.to_thread(ChatTemplate.for_model, model)
        clock = MonotonicClock()
        gw = Gateway(plane.clients, router_from_config(config.router, list(plane.clients), clock),
                     ChatDecode(plane.tokenizer), template, model=model, clock=clock,
                     config=config.gateway, eos_token_id=plane.tokenizer.eos_token_id)
        if records is not None:
            folder = records

            async def write(rec: SessionRecord) -> None:
                path = folder / f"{rec.session_id}.json"
                await asyncio.to_thread(path.write_text, json.dumps(rec.to_dict()))

            gw.on_close = write
        async with running(gw, admin_token=admin) as root:
            print(json.dumps({"gateway": root, "model": gw.model, "chat": template is not None,
                              "admin_sessions": admin is not None}), flush=True)
            for i in range(config.gateway.sessions):
                h = gw.open_session(f"user-{i}", f"user-{i}")
                print(json.dumps({"session": h.session_id, "base_url": h.base_url,
                                  "api_key": h.api_key}), flush=True)
            stopped = asyncio.Event()
            undo = stop_on_signals(stopped.set)
            try:
                await stopped.wait()
            finally:
                undo()
                for s in gw.sessions.open_sessions():
                    await gw.close_session(s.session_id)
    print(json.dumps({"stopped": True}), flush=True)
