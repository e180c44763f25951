"""`rollbank numerics`: score the same sampled tokens with the engine and the trainer.

Starts one managed vLLM server per ``--engine-dtypes`` entry, one after the other (the first
samples ``--prompts`` x ``--max-tokens`` tokens at temperature 1; each scores every sequence
with prompt log-probs), then scores the sequences with the trainer variants, and writes
``numerics.json`` + ``numerics.png`` to ``--out`` (per-token |delta log-prob| histograms,
mismatch k3, share over 0.1 / 0.5 nats, by position and token frequency, and what aligning
dtype / LM head buys). Heavy imports happen inside the handler.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

VARIANTS = ("trainer-fp32", "trainer-bf16-fp32head", "trainer-bf16")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "numerics", help="engine vs trainer log-prob mismatch on the same sampled tokens (JSON + PNG)")
    p.add_argument("--model", default="tiny", help="'tiny', 'gemma-3-270m' or a model folder")
    p.add_argument("--engine-dtypes", type=_csv, default=("bfloat16", "float32"),
                   help="vLLM dtypes, comma-separated; the first samples (default: bfloat16,float32)")
    p.add_argument("--trainer-variants", type=_csv, default=VARIANTS,
                   help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--prompts", type=int, default=8, help="sequences to sample")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens sampled per sequence")
    p.add_argument("--compile", choices=("inductor", "eager"), default="inductor",
                   help="vLLM compilation (inductor: what serving uses)")
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV cache of the server (GiB)")
    p.add_argument("--threads", type=int, default=None, help="threads of server and trainer (default: auto)")
    p.add_argument("--out", type=Path, default=Path("numerics-out"), help="output folder")
    p.add_argument("--no-plot", action="store_true", help="JSON only (no matplotlib)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from rollbank.errors import ConfigError
    from rollbank.numerics.run import (
        NumericsPlan,
        build_report,
        engine_sources,
        headline,
        trainer_sources,
        write_outputs,
    )

    bad = [v for v in args.trainer_variants if v not in VARIANTS]
    if bad or not args.engine_dtypes:
        raise ConfigError(f"unknown trainer variants {bad}" if bad else "no engine dtype given")
    plan = NumericsPlan(model=args.model, engine_dtypes=args.engine_dtypes,
                        trainer_variants=args.trainer_variants, prompts=args.prompts,
                        max_tokens=args.max_tokens, compile=args.compile,
                        kv_cache_gib=args.kv_cache_gib, threads=args.threads, out=args.out)
    seqs, sources, meta = asyncio.run(engine_sources(plan))
    trained, tmeta = trainer_sources(plan, seqs)
    report = build_report(plan, seqs, {**sources, **trained}, {**meta, **tmeta})
    for path in write_outputs(report, plan.out, plot=not args.no_plot):
        print(f"wrote {path}")
    for line in headline(report):
        print(line)
    return 0
