"""`rollbank serve`: start managed vLLM servers, print their addresses, stay up until Ctrl-C.

Every ServerConfig field is a flag (generated from the config model: `--num-servers`,
`--dtype`, `--max-model-len`...; `auto` where the field allows it). `--check` sends one real
completion (token ids in, token ids + log-probs out) to every server and prints it. Heavy
imports happen inside the handler.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    from rollbank.cli.flags import add_config_flags
    from rollbank.inference.config import ServerConfig

    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="start managed vLLM servers (tiny, gemma-3-270m or a local HF folder)",
        description=__doc__)
    p.add_argument("--config", type=Path, help="TOML file with ServerConfig fields")
    p.add_argument("--check", action="store_true", help="send one real completion to each server")
    p.add_argument("--exit-after-check", action="store_true", help="stop after --check (for scripts)")
    p.add_argument("--prompt", default="Task: list the files in /app\n```bash\n", help="--check prompt")
    add_config_flags(p, ServerConfig, title="server configuration (ServerConfig fields)")
    p.set_defaults(func=run)


def config_from(args: argparse.Namespace) -> Any:
    """The ServerConfig of a `rollbank serve` command line."""
    from rollbank.cli.flags import overrides_from
    from rollbank.config import apply_overrides, read_toml, validate
    from rollbank.inference.config import ServerConfig

    values, origins = overrides_from(args)
    data, source = ({}, "<defaults>") if args.config is None else read_toml(
        args.config, default_text="", default_name="")
    return validate(ServerConfig, apply_overrides(data, values, origins), source=source,
                    overrides=values, origins=origins)


def run(args: argparse.Namespace) -> int:
    import asyncio

    cfg = config_from(args)  # a bad flag fails here, before anything starts
    try:
        return asyncio.run(_serve(args, cfg))
    except KeyboardInterrupt:
        print("[rollbank] stopped", flush=True)
        return 0


async def _serve(args: argparse.Namespace, cfg: Any) -> int:
    import time

    from rollbank.inference.models import load_tokenizer
    from rollbank.inference.protocol import GenerateRequest, SamplingParams
    from rollbank.inference.server import ManagedServers

    t0 = time.monotonic()
    managed = ManagedServers(cfg)
    print(f"[rollbank] {managed.plan.line()}", flush=True)
    print(f"[rollbank] starting {managed.plan.num_servers} vLLM server(s) for {cfg.model!r}...", flush=True)
    async with managed as ms:
        print(f"[rollbank] healthy after {time.monotonic() - t0:.1f} s; logs in {ms.run_dir}", flush=True)
        for url, s in zip(ms.urls, ms.servers, strict=True):
            print(json.dumps({"server": s.index, "url": url, "startup_s": round(s.startup_s[-1], 1)}), flush=True)
        if args.check:
            assert ms.model_dir is not None
            tok = load_tokenizer(ms.model_dir)
            ids = ([tok.bos_token_id] if tok.bos_token_id is not None else []) + tok.encode(args.prompt)
            for i, client in enumerate(ms.clients):
                r = await client.generate(
                    GenerateRequest(f"serve-check-{i}", ids, SamplingParams(max_tokens=32, temperature=0.0))
                )
                print(
                    json.dumps(
                        {
                            "check": client.base_url,
                            "prompt_tokens": r.prompt_tokens,
                            "completion": r.text,
                            "token_ids": r.token_ids[:8],
                            "logprobs": [round(x, 4) for x in r.logprobs[:8]],
                            "finish_reason": r.finish_reason,
                            "total_s": round(r.timings.total_s, 3),
                        }
                    ),
                    flush=True,
                )
            if args.exit_after_check:
                return 0
        print("[rollbank] serving; Ctrl-C to stop", flush=True)
        await wait_for_stop_signal()
        print("[rollbank] stopping servers...", flush=True)
    print("[rollbank] stopped", flush=True)
    return 0


async def wait_for_stop_signal() -> None:
    """Return at SIGINT or SIGTERM (:func:`rollbank.signals.stop_on_signals`; off the main
    thread nothing is installed and the caller stops the command by cancelling)."""
    import asyncio

    from rollbank.signals import stop_on_signals

    stop = asyncio.Event()
    stop_on_signals(stop.set)  # the handlers stay: a second Ctrl-C does not break the servers' stop
    await stop.wait()
