"""``rollbank bench gateway``: what the OpenAI-compatible gateway adds per request, and its
throughput with many concurrent agents.

Latency: ``--pairs`` rounds per route, in one run on the same engine, every request with a
fresh random prompt of the same length (token ids, greedy, ``--max-tokens``; no request shares a prefix with
another, so no prefix-cache hit favours an arm). Each round sends one request per arm, in
rotating order (each arm first as often):

- ``direct``: the engine's own route (``VLLMClient.generate_call``: what rollbank's engine
  client would send), posted by the same HTTP client the gateway arm uses: the agent calling
  vLLM directly, token ids in and out;
- ``engine_client``: rollbank's engine client (``InferenceClient.generate``);
- ``gateway``: ``POST /v1/completions`` (or ``/v1/chat/completions``) through the gateway over
  real HTTP on 127.0.0.1, a session per request;
- ``forwarder`` (a real engine only): the direct arm's request through a forwarder that does
  nothing but pass it on (:mod:`rollbank_bench.gateway_forwarder`: served and calling the
  engine the way the gateway is), the floor of any HTTP gateway on this host.

All keep their connections alive. Reported, p50/p95: each arm's wall time; ``added``, the
gateway's added latency (gateway minus direct in the same round: the gateway's HTTP server,
its own work and its call to the engine); ``added_vs_engine_client`` (gateway minus engine
client: the agent's HTTP client and the gateway's server and work); ``gateway_inside`` (the
record's total minus the engine client's time); ``http_hop`` (the gateway arm's wall time
minus the record's total: the agent's request and response over loopback, uvicorn, the
routing); ``gateway_own`` (wall time minus the engine client's time: everything the gateway
arm spent outside the engine client, the agent's own HTTP client included);
``forwarder_added`` (forwarder minus direct: one HTTP hop in this process, nothing done);
``gateway_over_forwarder`` (gateway minus forwarder: the gateway's own work);
``host_wake_control``: the forwarder's hop to a handler that answers at once against one that
sleeps 30 ms first (what running Python again after the process slept costs on this host,
paid by any hop after an engine call). ``met``: the
``added`` p50 within the target. With ``--fake`` there is no engine HTTP server: ``direct``
is the engine client. A chat route adds the chat-template rendering and tool parsing: the
same numbers for ``/v1/chat/completions`` against the engine given the rendered ids.

Throughput: ``--agents`` agents at once, each a session speaking ``--turns`` chat turns
(resending its whole history, as agents do) through the official ``openai`` client; the same
number of concurrent loops straight to the engine for reference. Target (issue 23): added
latency <= 2 ms p50 on a quiet host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
    parser.add_argument("--accelsim-profile", default=None, metavar="PROFILE",
                        help="an emulated accelerator (accel-sim, a separate process: e.g. "
                        "h100-llama3.1-8b) instead of vLLM, with --model's tokenizer and template; "
                        "an engine that takes no CPU and answers on time, so the gateway's cost "
                        "is not lost in a CPU engine's noise")
    parser.add_argument("--pairs", type=int, default=60, help="rounds (direct, engine client, gateway) per route")
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


def _median_ci(xs: list[float], *, resamples: int = 2000) -> list[float] | None:
    """A 95% bootstrap interval of the median of ``xs`` (ms; fixed seed): how far the engine's
    noise leaves the paired difference's p50 uncertain."""
    from rollbank.quantiles import quantile

    if len(xs) < 2:
        return None
    rng = random.Random(1)
    meds = sorted(quantile([rng.choice(xs) for _ in xs], 0.5) or 0.0 for _ in range(resamples))
    return [round(1000 * meds[int(0.025 * resamples)], 3), round(1000 * meds[int(0.975 * resamples)], 3)]


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(_run(args))
    text = json.dumps(result, indent=2)
    print(text, flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        client, tok, template, desc = await _engine(args, stack)
        load_start = os.getloadavg()
        measured = await _measure(args, client, tok, template)
        regime = ("fake engine (in-process)" if args.fake else
                  f"emulated accelerator (accel-sim {args.accelsim_profile}, its own process)"
                  if args.accelsim_profile else "real vLLM on CPU")
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

    if args.accelsim_profile:
        from rollbank.inference.models import ensure_model
        from rollbank.inference_plane import vocab_size
        from rollbank_bench.accelsim.process import AccelSimServers

        model_dir = await asyncio.to_thread(ensure_model, args.model)
        tok = load_tokenizer(model_dir)
        sims = await stack.enter_async_context(AccelSimServers(args.accelsim_profile, vocab_size=vocab_size(tok)))
        template = await asyncio.to_thread(ChatTemplate.for_model, args.model)
        return (sims.clients[0], ChatDecode(tok), template,
                f"accel-sim {args.accelsim_profile} (1 server), {args.model}'s tokenizer")

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
    from rollbank_bench.gateway_forwarder import forwarding

    clock = MonotonicClock()
    gw = Gateway({client.base_url: client}, make_router("cache_aware", [client.base_url], clock),
                 tok, template, model=args.model, clock=clock,
                 config=GatewaySection(max_tokens_cap=4096), eos_token_id=tok.eos_token_id)
    rng = random.Random(0)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    out: dict[str, Any] = {"pairs": args.pairs, "max_tokens": args.max_tokens,
                           "prompt_tokens": args.prompt_tokens}
    async with contextlib.AsyncExitStack() as stack:
        root = await stack.enter_async_context(running(gw))
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=120, limits=httpx.Limits(
            max_connections=256, max_keepalive_connections=256)))
        forwarder = None if args.fake else await stack.enter_async_context(forwarding(client.base_url))
        n = [0]
        if not args.fake:
            await client.connect()  # the route its generations take: the direct arm's too

        async def direct(ids: list[int], via_url: str | None = None) -> float:
            """The engine's own HTTP route, from the agent arm's HTTP client (real engine), or
            the engine client (fake engine: no HTTP server); through ``via_url`` (the
            forwarder) if given."""
            if args.fake:
                return await engine_client(ids)
            n[0] += 1
            path, body = client.generate_call(GenerateRequest(f"direct-{n[0]}", ids, sampling))
            t0 = time.perf_counter()
            r = await http.post(f"{via_url or client.base_url}{path}", json=body)
            r.json()
            wall = time.perf_counter() - t0
            r.raise_for_status()
            return wall

        async def engine_client(ids: list[int]) -> float:
            n[0] += 1
            t0 = time.perf_counter()
            await client.generate(GenerateRequest(f"client-{n[0]}", ids, sampling))
            return time.perf_counter() - t0

        async def via(path: str, body: dict[str, Any]) -> tuple[float, float, float, float]:
            n[0] += 1
            h = gw.open_session(f"bench-{n[0]}-{path}", "bench")
            t0 = time.perf_counter()
            r = await http.post(f"{h.base_url}/{path}", json=body,
                                headers={"Authorization": f"Bearer {h.api_key}"})
            r.json()
            wall = time.perf_counter() - t0
            r.raise_for_status()
            rec = (await gw.close_session(h)).requests[-1]
            inside = (rec.timings.total_s or 0.0) - (rec.timings.engine.get("total_s") or 0.0)
            engine = rec.timings.engine.get("total_s") or 0.0
            return wall, inside, wall - (rec.timings.total_s or 0.0), wall - engine

        def fresh(arm: str) -> tuple[list[int], dict[str, Any]]:
            """A new random prompt (no arm shares a prefix with another: no cache hit favours
            one), as token ids and as the gateway arm's request body."""
            if arm == "completions":
                ids = [rng.randrange(100, 20000) for _ in range(args.prompt_tokens)]
                return ids, {"model": "m", "prompt": ids, "max_tokens": args.max_tokens,
                             "temperature": 0}
            words = " ".join(rng.choice(("ls", "cat", "file", "dir", "run", "test", "why"))
                             for _ in range(args.prompt_tokens // 2))
            msgs = [{"role": "user", "content": f"{rng.randrange(10**9)} {words}"}]
            ids = tok.encode(template.render(msgs, add_generation_prompt=True))
            return ids, {"model": "m", "messages": msgs, "max_tokens": args.max_tokens, "temperature": 0}

        for arm in ("completions", "chat"):
            cols: dict[str, list[float]] = {k: [] for k in (
                "direct", "engine_client", "gateway", "added", "added_vs_engine_client",
                "gateway_inside", "http_hop", "gateway_own")}
            if forwarder is not None:
                cols.update(forwarder=[], forwarder_added=[], gateway_over_forwarder=[])
            route = arm.replace("chat", "chat/completions")
            order = ("direct", "engine_client", "gateway") + (("forwarder",) if forwarder else ())
            k_arms = len(order)
            for i in range(args.pairs + 3):  # 3 warm-up rounds, not counted
                got: dict[str, Any] = {}
                for name in order[i % k_arms:] + order[:i % k_arms]:  # each arm first as often
                    ids, body = fresh(arm)
                    if name == "direct":
                        got[name] = await direct(ids)
                    elif name == "forwarder":
                        got[name] = await direct(ids, forwarder)
                    elif name == "engine_client":
                        got[name] = await engine_client(ids)
                    else:
                        got[name] = await via(route, body)
                if i < 3:
                    continue
                g, ins, hp, ow = got["gateway"]
                for k, v in (("direct", got["direct"]), ("engine_client", got["engine_client"]),
                             ("gateway", g), ("added", g - got["direct"]),
                             ("added_vs_engine_client", g - got["engine_client"]),
                             ("gateway_inside", ins), ("http_hop", hp), ("gateway_own", ow)):
                    cols[k].append(v)
                if forwarder is not None:
                    cols["forwarder"].append(got["forwarder"])
                    cols["forwarder_added"].append(got["forwarder"] - got["direct"])
                    cols["gateway_over_forwarder"].append(g - got["forwarder"])
            print(json.dumps({"progress": arm, "rounds": len(cols["added"])}), file=sys.stderr, flush=True)
            out[arm] = {k: _stats(v) for k, v in cols.items()}
            for k in ("added", "forwarder_added", "gateway_over_forwarder"):
                if k in cols:
                    out[arm][k]["p50_ci95_ms"] = _median_ci(cols[k])
        if forwarder is not None:
            out["host_wake_control"] = await _wake_control(http, forwarder, args.pairs)
        out["throughput"] = await _throughput(args, root, gw, client, tok, template)
        out["http_parser"] = gw.http_parser
    out["direct_arm"] = ("engine client (no HTTP server: fake engine)" if args.fake else
                         "the engine's own route, from the agent arm's HTTP client")
    p50 = out["completions"]["added"]["p50_ms"]
    out["target_added_p50_ms"] = 2.0
    out["met"] = p50 is not None and p50 <= 2.0
    return out


async def _wake_control(http: Any, forwarder: str, rounds: int) -> dict[str, Any]:
    """The same loopback hop to a handler that answers at once and to one that first sleeps
    as long as an emulated engine call (30 ms), alternated: the hop's time outside the
    handler in each, and the difference (what running again after sleeping costs here)."""
    from rollbank_bench.gateway_forwarder import SLEEP

    hops: dict[str, list[float]] = {"0": [], "30": []}
    for i in range(rounds + 3):
        for ms in ("0", "30") if i % 2 else ("30", "0"):
            t0 = time.perf_counter()
            r = await http.post(f"{forwarder}{SLEEP}{ms}", content=b"{}")
            inside = r.json()["inside_s"]
            if i >= 3:
                hops[ms].append(time.perf_counter() - t0 - inside)
    return {"handler_sleep_ms": 30, "hop_answering_at_once": _stats(hops["0"]),
            "hop_after_sleeping": _stats(hops["30"]),
            "difference": _stats([b - a for a, b in zip(hops["0"], hops["30"], strict=True)])}


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
