"""``rollbank bench gateway``: what the OpenAI-compatible gateway adds per request, and its
throughput with many concurrent agents.

Latency: ``--pairs`` pairs, interleaved in one run on the same engine; each pair sends the
same fresh random prompt (token ids, greedy, ``--max-tokens``) once straight to the engine
(``InferenceClient.generate``) and once through the gateway (``POST /v1/completions`` over
real HTTP on 127.0.0.1, a session per pair), in alternating order so the prefix cache favours
neither arm. Both arms keep their connections alive (the bench's client to the gateway, and
the one engine client, used by the direct arm and by the gateway). Reported: p50/p95 of each
arm's wall time, of the paired difference (the gateway's added latency), of the gateway's own
time inside it (record total minus the engine's total) and of the HTTP hop to it (the
gateway arm's wall time minus the record total: the client's request and response over
loopback, uvicorn and the routing; not subject to the engine's noise, which the paired
difference is on a loaded host), and their sum per request, ``gateway_own`` (wall time minus
the engine client's time for that request: all the gateway arm spent outside the engine).
``met``: both the paired difference's p50 and ``gateway_own``'s p50 within the target (on a
loaded host the paired difference is the engine's noise and can be negative). A chat arm adds the chat-template rendering and tool parsing: the same
numbers for ``/v1/chat/completions`` against the engine given the rendered ids.

Throughput: ``--agents`` agents at once, each a session speaking ``--turns`` chat turns
(resending its whole history, as agents do) through the official ``openai`` client; the same
number of concurrent loops straight to the engine for reference. Target (issue 23): added
latency <= 2 ms p50 on a quiet host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m-instruct", help="project model or folder")
    parser.add_argument("--fake", action="store_true", help="the in-process fake engine instead of vLLM")
    parser.add_argument("--pairs", type=int, default=60, help="interleaved direct/gateway pairs per arm")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--json", action="store_true", help="JSON only (the default output anyway)")


def _stats(xs: list[float]) -> dict[str, float | None]:
    from rollbank.quantiles import quantile

    def ms(q: float) -> float | None:
        v = quantile(xs, q)
        return None if v is None else round(1000 * v, 3)

    return {"p50_ms": ms(0.5), "p95_ms": ms(0.95), "n": len(xs)}


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(_run(args))
    text = json.dumps(result, indent=2)
    print(text, flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    import contextlib

    async with contextlib.AsyncExitStack() as stack:
        client, tok, template, desc = await _engine(args, stack)
        load_start = os.getloadavg()
        measured = await _measure(args, client, tok, template)
        regime = "fake engine (in-process)" if args.fake else "real vLLM on CPU"
        return {"bench": "gateway", "engine": desc, "regime": regime,
                "host_load_1m": os.getloadavg()[0],
                "host_load_start": [round(x, 2) for x in load_start],
                "host_load_end": [round(x, 2) for x in os.getloadavg()],
                "cpus": os.cpu_count(), **measured}
    raise AssertionError("unreachable")


async def _engine(args: argparse.Namespace, stack: Any) -> tuple[Any, Any, Any, str]:
    from rollbank.chat.template import ChatTemplate
    from rollbank.gateway.tokens import ChatDecode

    if args.fake:
        from rollbank.inference.fake import FakeInferenceServer
        from rollbank.inference.fake_client import FakeInferenceClient

        server = FakeInferenceServer(base_url="fake://0", decode_s_per_token=0.002)
        chatml = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                  "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                  "{% endif %}")
        return (FakeInferenceClient(server), ChatDecode(server.tokenizer),
                ChatTemplate(chatml, name="chatml", use_transformers=False), "fake")
    from rollbank.inference.config import ServerConfig
    from rollbank.inference.server import ManagedServers
    from rollbank.inference.tokenizer import load_tokenizer

    ms = await stack.enter_async_context(ManagedServers(ServerConfig(model=args.model, kv_cache_gib=1)))
    assert ms.model_dir is not None
    template = await asyncio.to_thread(ChatTemplate.for_model, args.model)
    return ms.clients[0], ChatDecode(load_tokenizer(ms.model_dir)), template, f"vllm {args.model} (1 server)"


async def _measure(args: argparse.Namespace, client: Any, tok: Any, template: Any) -> dict[str, Any]:
    import httpx

    from rollbank.clock import MonotonicClock
    from rollbank.gateway.config import GatewaySection
    from rollbank.gateway.gateway import Gateway
    from rollbank.gateway.serve import running
    from rollbank.inference.protocol import GenerateRequest, SamplingParams
    from rollbank.routing.factory import make_router

    clock = MonotonicClock()
    gw = Gateway({client.base_url: client}, make_router("cache_aware", [client.base_url], clock),
                 tok, template, model=args.model, clock=clock,
                 config=GatewaySection(max_tokens_cap=4096), eos_token_id=tok.eos_token_id)
    rng = random.Random(0)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    out: dict[str, Any] = {"pairs": args.pairs, "max_tokens": args.max_tokens,
                           "prompt_tokens": args.prompt_tokens}
    async with running(gw) as root, httpx.AsyncClient(timeout=120, limits=httpx.Limits(
            max_connections=256, max_keepalive_connections=256)) as http:
        n = [0]

        async def direct(ids: list[int]) -> float:
            n[0] += 1
            t0 = time.perf_counter()
            await client.generate(GenerateRequest(f"direct-{n[0]}", ids, sampling))
            return time.perf_counter() - t0

        async def via(path: str, body: dict[str, Any]) -> tuple[float, float, float, float]:
            h = gw.open_session(f"bench-{n[0]}-{path}", "bench")
            t0 = time.perf_counter()
            r = await http.post(f"{h.base_url}/{path}", json=body,
                                headers={"Authorization": f"Bearer {h.api_key}"})
            wall = time.perf_counter() - t0
            r.raise_for_status()
            rec = (await gw.close_session(h)).requests[-1]
            inside = (rec.timings.total_s or 0.0) - (rec.timings.engine.get("total_s") or 0.0)
            engine = rec.timings.engine.get("total_s") or 0.0
            return wall, inside, wall - (rec.timings.total_s or 0.0), wall - engine

        for arm in ("completions", "chat"):
            d_walls, g_walls, added, inside, hop, own = [], [], [], [], [], []
            for i in range(args.pairs + 3):  # 3 warm-up pairs, not counted
                if arm == "completions":
                    ids = [rng.randrange(100, 20000) for _ in range(args.prompt_tokens)]
                    body: dict[str, Any] = {"model": "m", "prompt": ids, "max_tokens": args.max_tokens,
                                            "temperature": 0}
                else:
                    words = " ".join(rng.choice(("ls", "cat", "file", "dir", "run", "test", "why"))
                                     for _ in range(args.prompt_tokens // 2))
                    msgs = [{"role": "user", "content": words}]
                    ids = tok.encode(template.render(msgs, add_generation_prompt=True))
                    body = {"model": "m", "messages": msgs, "max_tokens": args.max_tokens, "temperature": 0}
                first_direct = i % 2 == 0
                if first_direct:
                    d = await direct(ids)
                    g, ins, hp, ow = await via(arm.replace("chat", "chat/completions"), body)
                else:
                    g, ins, hp, ow = await via(arm.replace("chat", "chat/completions"), body)
                    d = await direct(ids)
                if i >= 3:
                    d_walls.append(d)
                    g_walls.append(g)
                    added.append(g - d)
                    inside.append(ins)
                    hop.append(hp)
                    own.append(ow)
            print(json.dumps({"progress": arm, "pairs": len(added)}), file=sys.stderr, flush=True)
            out[arm] = {"direct": _stats(d_walls), "gateway": _stats(g_walls),
                        "added": _stats(added), "gateway_inside": _stats(inside),
                        "http_hop": _stats(hop), "gateway_own": _stats(own)}
        out["throughput"] = await _throughput(args, root, gw, client, tok, template)
        out["http_parser"] = gw.http_parser
    p50s = [out["completions"][k]["p50_ms"] for k in ("added", "gateway_own")]
    out["target_added_p50_ms"] = 2.0
    out["met"] = all(p is not None and p <= 2.0 for p in p50s)
    return out


async def _throughput(args: argparse.Namespace, root: str, gw: Any, client: Any, tok: Any,
                      template: Any) -> dict[str, Any]:
    import httpx2
    from openai import AsyncOpenAI

    from rollbank.inference.protocol import GenerateRequest, SamplingParams

    http = httpx2.AsyncClient(timeout=300, limits=httpx2.Limits(max_connections=args.agents * 2))
    tokens = [0]

    async def agent(i: int) -> None:
        h = gw.open_session(f"agent-{i}", f"group-{i // 8}")
        c = AsyncOpenAI(base_url=h.base_url, api_key=h.api_key, http_client=http, max_retries=0)
        msgs: list[Any] = [{"role": "system", "content": "You are a shell agent."},
                           {"role": "user", "content": f"task {i}: list the files"}]
        for t in range(args.turns):
            r = await c.chat.completions.create(model="m", messages=msgs, max_tokens=args.max_tokens * 4)
            tokens[0] += r.usage.completion_tokens if r.usage else 0
            msgs += [r.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": f"output of turn {t}: ok"}]
        rec = await gw.close_session(h)
        assert len(rec.segments) >= 1

    print(json.dumps({"progress": "throughput", "agents": args.agents}), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    await asyncio.gather(*(agent(i) for i in range(args.agents)))
    wall = time.perf_counter() - t0
    gw_tokens = tokens[0]
    await http.aclose()

    async def loop(i: int) -> None:
        ids = tok.encode(template.render([{"role": "system", "content": "You are a shell agent."},
                                          {"role": "user", "content": f"task {i}: list the files"}],
                                         add_generation_prompt=True))
        for t in range(args.turns):
            r = await client.generate(GenerateRequest(f"tp-{i}-{t}", ids, SamplingParams(
                max_tokens=args.max_tokens * 4, temperature=1.0)))
            ids = ids + r.token_ids + tok.encode(f"\n<|im_start|>user\noutput of turn {t}: ok"
                                                 "<|im_end|>\n<|im_start|>assistant\n")
            tokens[0] += len(r.token_ids)

    tokens[0] = 0
    t1 = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(args.agents)))
    direct_wall = time.perf_counter() - t1
    reqs = args.agents * args.turns
    return {"agents": args.agents, "turns": args.turns, "requests": reqs,
            "gateway": {"wall_s": round(wall, 3), "requests_per_s": round(reqs / wall, 2),
                        "completion_tokens_per_s": round(gw_tokens / wall, 1)},
            "direct": {"wall_s": round(direct_wall, 3), "requests_per_s": round(reqs / direct_wall, 2),
                       "completion_tokens_per_s": round(tokens[0] / direct_wall, 1)}}
