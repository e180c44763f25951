"""`rollbank serve`: start managed vLLM servers, print their addresses, stay up until Ctrl-C.

``--check`` sends one real completion (token ids in, token ids + log-probs out) to every
server and prints it. Heavy imports happen inside the handler.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="start managed vLLM servers (tiny, gemma-3-270m or a local HF folder)"
    )
    p.add_argument("--model", default="gemma-3-270m", help="'tiny', 'gemma-3-270m' or a model folder")
    p.add_argument("--num-servers", type=_count, default="auto", help="number of vLLM processes (auto: from the host)")
    p.add_argument("--threads", type=_count, default="auto", help="OpenMP threads per server (auto: from the host)")
    p.add_argument("--compile", choices=("inductor", "eager"), default=None,
                   help="vLLM compilation (default: the config's)")
    p.add_argument("--port", type=int, default=None, help="port of server 0 (then port+1...); default: free ports")
    p.add_argument("--host", default="127.0.0.1", help="bind address")
    p.add_argument("--max-model-len", type=int, default=2048, help="context length")
    p.add_argument("--kv-cache-gib", type=float, default=2.0, help="KV cache per server (GiB)")
    p.add_argument("--dtype", default="auto",
                   help="vLLM --dtype (auto: bfloat16 on native-bf16 CPUs, else float32)")
    p.add_argument("--enable-lora", action="store_true", help="allow runtime LoRA loading")
    p.add_argument("--run-dir", type=Path, default=None, help="where server logs go")
    p.add_argument("--startup-timeout", type=float, default=1200.0, help="seconds to wait for health")
    p.add_argument("--check", action="store_true", help="send one real completion to each server")
    p.add_argument("--exit-after-check", action="store_true", help="stop after --check (for scripts)")
    p.add_argument("--prompt", default="Task: list the files in /app\n```bash\n", help="--check prompt")
    p.set_defaults(func=run)


def _count(text: str) -> int | str:
    """'auto' or a positive integer (argparse type)."""
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive integer, got {text!r}")
    return n


def run(args: argparse.Namespace) -> int:
    import asyncio

    from rollbank.errors import RollbankError

    try:
        return asyncio.run(_serve(args))
    except KeyboardInterrupt:
        print("[rollbank] stopped", flush=True)
        return 0
    except RollbankError as exc:
        print(f"[rollbank] error: {exc}", flush=True)
        return 1


async def _serve(args: argparse.Namespace) -> int:
    import asyncio
    import signal
    import time

    from rollbank.inference.config import ServerConfig
    from rollbank.inference.models import load_tokenizer
    from rollbank.inference.protocol import GenerateRequest, SamplingParams
    from rollbank.inference.server import ManagedServers

    cfg = ServerConfig(
        model=args.model,
        num_servers=args.num_servers,
        threads=args.threads,
        host=args.host,
        port=args.port,
        max_model_len=args.max_model_len,
        kv_cache_gib=args.kv_cache_gib,
        dtype=args.dtype,
        enable_lora=args.enable_lora,
        run_dir=args.run_dir,
        startup_timeout_s=args.startup_timeout,
        **({"compile": args.compile} if args.compile else {}),
    )
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
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        print("[rollbank] stopping servers...", flush=True)
    print("[rollbank] stopped", flush=True)
    return 0
