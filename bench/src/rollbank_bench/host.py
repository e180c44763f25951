"""`rollbank bench host`: what this host chose, and server start + tokens/s per dtype/compile arm.

Prints the host facts and the automatic choice (inference/host.py), then for each arm
``dtype:compile`` (e.g. ``float32:inductor``) starts one managed vLLM server twice against a
fresh compile cache -- cold (empty cache), then warm (the cache the cold start left) -- and
measures, on the warm server, decode throughput with ``--max-tokens`` forced tokens
(``min_tokens`` = ``max_tokens``) for one request alone and for ``--concurrency`` at once.
One JSON object on stdout; progress on stderr. Servers are started one at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--json", action="store_true", help="print one JSON object (the default output anyway)")
    a("--model", default="tiny", help="'tiny', 'gemma-3-270m' or a model folder")
    a("--arms", default="auto",
      help="comma-separated dtype:compile arms (compile: inductor|eager); 'auto': the chosen dtype "
      "and the other candidate, each with inductor and eager; '' for the choice only")
    a("--max-tokens", type=int, default=64, help="tokens per completion")
    a("--concurrency", type=int, default=16, help="requests at once for the aggregate rate")
    a("--no-warm", action="store_true", help="cold start only (skip the warm restart)")
    a("--log-dir", type=Path, default=None, help="keep the server logs here (default: discarded)")


def _arms(spec: str, chosen: str | None) -> list[tuple[str, str]]:
    if spec == "auto":
        first = chosen or "float32"
        other = "float32" if first == "bfloat16" else "bfloat16"
        return [(d, c) for d in (first, other) for c in ("inductor", "eager")]
    out = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        dtype, _, compile_ = item.partition(":")
        out.append((dtype, compile_ or "inductor"))
    return out


def _log(msg: str) -> None:
    print(f"[bench host] {msg}", file=sys.stderr, flush=True)


async def _rate(client: Any, prompt: list[int], max_tokens: int, n: int) -> float:
    from rollbank.inference.protocol import GenerateRequest, SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, temperature=1.0)
    t0 = time.monotonic()
    results = await asyncio.gather(*(client.generate(GenerateRequest(f"bench-{n}-{i}", prompt, sp))
                                     for i in range(n)))
    tokens = sum(len(r.token_ids) for r in results)
    return tokens / (time.monotonic() - t0)


async def _arm(args: argparse.Namespace, dtype: str, compile_: str, cache: Path) -> dict[str, Any]:
    from rollbank.inference.config import ServerConfig
    from rollbank.inference.server import ManagedServers

    out: dict[str, Any] = {"dtype": dtype, "compile": compile_}
    for phase in ("cold", "warm")[: 1 if args.no_warm else 2]:
        cfg = ServerConfig(model=args.model, num_servers=1, dtype=dtype, compile=compile_,  # type: ignore[arg-type]
                           compile_cache_dir=cache,
                           run_dir=(args.log_dir or cache) / f"{dtype}-{compile_}-{phase}")
        _log(f"{dtype}:{compile_} {phase} start...")
        t0 = time.monotonic()
        async with ManagedServers(cfg) as ms:
            out[f"start_{phase}_s"] = round(time.monotonic() - t0, 1)
            _log(f"{dtype}:{compile_} {phase} healthy after {out[f'start_{phase}_s']} s")
            if phase == "warm" or args.no_warm:
                client = ms.clients[0]
                prompt = list(range(10, 74))
                await _rate(client, prompt, 8, 1)  # first request pays any lazy set-up
                out["tok_s_1"] = round(await _rate(client, prompt, args.max_tokens, 1), 1)
                out[f"tok_s_{args.concurrency}"] = round(
                    await _rate(client, prompt, args.max_tokens, args.concurrency), 1)
                _log(f"{dtype}:{compile_} {out}")
    return out


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    from rollbank.inference.host import detect_host, plan_inference

    facts = detect_host()
    plan = plan_inference(facts)
    report: dict[str, Any] = {
        "host": {"cpu": facts.cpu_model, "cores": facts.cores, "memory_gib": round(facts.memory_gib, 1),
                 "isa": facts.isa, "native_bf16": facts.native_bf16},
        "choice": {"dtype": plan.dtype, "num_servers": plan.num_servers,
                   "threads_per_server": plan.threads_per_server, "line": plan.line()},
        "model": args.model, "max_tokens": args.max_tokens, "arms": [],
    }
    _log(plan.line())
    for dtype, compile_ in _arms(args.arms, plan.dtype):
        with tempfile.TemporaryDirectory(prefix="rollbank-bench-host-") as tmp:
            report["arms"].append(await _arm(args, dtype, compile_, Path(tmp)))
    return report


def run(args: argparse.Namespace) -> int:
    print(json.dumps(asyncio.run(_main(args)), indent=2))
    return 0
