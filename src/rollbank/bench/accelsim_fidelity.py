"""`rollbank bench accelsim-fidelity`: the accelsim benchmark engine vs real vLLM CPU (JSON).

Sends one seeded request trace (groups of siblings sharing a prompt prefix, arrivals in
waves, ``min_tokens = max_tokens`` so both engines generate the same number of tokens) to a
managed real vLLM server (the tiny model) and to an accelsim engine process with the CPU
profile, through the same :class:`~rollbank.inference.vllm_client.VLLMClient` on
``/v1/completions`` (vLLM 0.32 reports per-request timings there, not on the scale-out
generate route), and reports
median TTFT (engine-reported queue + prefill) and median per-request latency (client wall time)
of each, their relative errors (target <= 15%), the per-request median absolute error and the
prefix-cache hit rates.

``--calibrate`` instead measures the real server (TTFT vs prompt length on single requests;
decode step time vs batch size) and prints the fitted profile numbers (the CPU profile file
``cpu-tiny-vllm032.toml`` was written from this output).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

from rollbank.inference.protocol import GenerateRequest, SamplingParams
from rollbank.inference.vllm_client import VLLMClient


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--json", action="store_true", help="print one JSON object (the default output anyway)")
    a("--profile", default="cpu-tiny-vllm032", help="accelsim profile compared with real vLLM")
    a("--model", default="tiny", help="real vLLM model ('tiny' matches the CPU profile)")
    a("--groups", type=int, default=12, help="trace: prompt groups")
    a("--group-size", type=int, default=4, help="trace: siblings per group (share the prompt)")
    a("--waves", type=int, default=3, help="trace: arrival waves (groups are split among them)")
    a("--wave-gap-s", type=float, default=1.0, help="trace: seconds between waves")
    a("--seed", type=int, default=0, help="trace seed")
    a("--block-size", type=int, default=32, help="KV block size of the real server (the profile's)")
    a("--real-url", default=None,
      help="an already running real vLLM server (started with rollbank's managed flags) instead "
      "of starting one")
    a("--calibrate", action="store_true", help="measure the real server and print fitted profile numbers")


@dataclass(frozen=True)
class TraceItem:
    at_s: float
    request: GenerateRequest


def make_trace(*, groups: int, group_size: int, waves: int, wave_gap_s: float, seed: int,
               vocab: int = 2048) -> list[TraceItem]:
    """Seeded trace: per group a prompt of 64..768 tokens and 16..64 output tokens."""
    rng = random.Random(seed)
    items: list[TraceItem] = []
    for g in range(groups):
        plen = rng.randint(64, 768)
        prompt = [rng.randrange(1, vocab) for _ in range(plen)]
        out = rng.randint(16, 64)
        wave = g % max(1, waves)
        for k in range(group_size):
            sp = SamplingParams(max_tokens=out, min_tokens=out, temperature=1.0)
            req = GenerateRequest(f"fid-{seed}-{g}-{k}", prompt, sp)
            items.append(TraceItem(wave * wave_gap_s + 0.05 * k, req))
    return sorted(items, key=lambda i: i.at_s)


async def run_trace(client: VLLMClient, trace: list[TraceItem]) -> list[dict[str, Any]]:
    await client.reset_prefix_cache()
    t0 = time.monotonic()

    async def one(item: TraceItem) -> dict[str, Any]:
        await asyncio.sleep(max(0.0, item.at_s - (time.monotonic() - t0)))
        r = await client.generate(item.request)
        return {"id": r.request_id, "ttft_s": r.timings.first_token_s, "total_s": r.timings.total_s,
                "tokens": len(r.token_ids), "prompt": r.prompt_tokens, "cached": r.cached_prompt_tokens}

    return list(await asyncio.gather(*(one(i) for i in trace)))


def _rel(emu: float, real: float) -> float:
    return (emu - real) / real if real else float("nan")


def compare(real: list[dict[str, Any]], emu: list[dict[str, Any]]) -> dict[str, Any]:
    by_id = {r["id"]: r for r in emu}
    pairs = [(r, by_id[r["id"]]) for r in real if r["id"] in by_id]
    out: dict[str, Any] = {"requests": len(pairs)}
    for key in ("ttft_s", "total_s"):
        rv = [r[key] for r, _ in pairs if r[key] is not None]
        ev = [e[key] for _, e in pairs if e[key] is not None]
        mr, me = statistics.median(rv), statistics.median(ev)
        per = [abs(_rel(e[key], r[key])) for r, e in pairs if r[key] and e[key] is not None]
        out[key] = {"real_median": round(mr, 4), "emulated_median": round(me, 4),
                    "median_error": round(_rel(me, mr), 4),
                    "per_request_median_abs_error": round(statistics.median(per), 4)}
    for name, rows in (("real", [r for r, _ in pairs]), ("emulated", [e for _, e in pairs])):
        prompt = sum(r["prompt"] for r in rows)
        out[f"{name}_cache_hit_rate"] = round(sum(r["cached"] or 0 for r in rows) / max(1, prompt), 4)
    out["within_15pct"] = all(abs(out[k]["median_error"]) <= 0.15 for k in ("ttft_s", "total_s"))
    return out


async def calibrate(client: VLLMClient, seed: int) -> dict[str, Any]:
    """TTFT vs prompt length (single requests) and decode step vs batch size, fitted."""
    rng = random.Random(seed + 1)
    pts_p: list[tuple[float, float]] = []
    for plen in (32, 128, 256, 512, 1024, 1536) * 2:
        await client.reset_prefix_cache()
        req = GenerateRequest(f"cal-p-{plen}-{rng.random()}", [rng.randrange(1, 2048) for _ in range(plen)],
                              SamplingParams(max_tokens=1, temperature=1.0))
        r = await client.generate(req)
        if r.timings.prefill_s is not None:
            pts_p.append((plen, r.timings.prefill_s))
    pts_d: list[tuple[float, float]] = []
    for batch in (1, 2, 4, 8, 16, 32):
        reqs = [GenerateRequest(f"cal-d-{batch}-{i}-{rng.random()}", [rng.randrange(1, 2048) for _ in range(64)],
                                SamplingParams(max_tokens=64, min_tokens=64, temperature=1.0))
                for i in range(batch)]
        rs = await asyncio.gather(*(client.generate(q) for q in reqs))
        itl = [r.timings.decode_s / (len(r.token_ids) - 1) for r in rs if r.timings.decode_s]
        pts_d.append((batch, statistics.median(itl)))
    pb, pa = _fit(pts_p)
    db, da = _fit(pts_d)
    return {"prefill_points": pts_p, "decode_points": pts_d,
            "fit": {"step_base_s": round(da, 6), "decode_per_seq_s": round(db, 7),
                    "prefill_per_token_s": round(pb, 8), "prefill_per_seq_s": round(max(0.0, pa - da), 6)}}


def _fit(pts: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope and intercept."""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return slope, my - slope * mx


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    from rollbank.bench.accelsim.process import AccelSimServers
    from rollbank.inference.server import ManagedServers, ServerConfig

    cfg = ServerConfig(model=args.model, num_servers=1, block_size=args.block_size)
    trace = make_trace(groups=args.groups, group_size=args.group_size, waves=args.waves,
                       wave_gap_s=args.wave_gap_s, seed=args.seed)
    out: dict[str, Any] = {"bench": "accelsim-fidelity", "profile": args.profile, "model": args.model}
    async with contextlib.AsyncExitStack() as stack:
        url = args.real_url or (await stack.enter_async_context(ManagedServers(cfg))).urls[0]
        client = VLLMClient(url, scale_out=False)  # completions: vLLM reports per-request timings there
        stack.push_async_callback(client.aclose)
        await client.connect()
        await client.generate(GenerateRequest("warmup", list(range(1, 65)), SamplingParams(max_tokens=8)))
        if args.calibrate:
            out["calibration"] = await calibrate(client, args.seed)
            return out
        real = await run_trace(client, trace)
    async with AccelSimServers(args.profile) as emu_servers:
        cpu0, t0 = emu_servers.cpu_s(), time.monotonic()
        emu_client = VLLMClient(emu_servers.urls[0], scale_out=False)  # same route as the real one
        emu = await run_trace(emu_client, trace)
        await emu_client.aclose()
        cpu, wall = emu_servers.cpu_s() - cpu0, time.monotonic() - t0
    out.update(compare(real, emu))
    out["emulator_cpu_s"] = round(cpu, 3)
    out["emulator_cpu_share_of_wall"] = round(cpu / wall, 4) if wall else None
    return out


def run(args: argparse.Namespace) -> int:
    print(json.dumps(asyncio.run(_main(args)), indent=2))
    return 0
