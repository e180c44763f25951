"""The engine fleet behind ``rollbank bench routing``: real vLLM servers or accelsim processes.

Owns :func:`open_fleet`, an async context manager that starts ``--servers`` engines of the
chosen kind and yields a :class:`Fleet`: their URLs, one control client per server (prefix-cache
resets between arms), the id range prompts may use, the KV block size (the router hashes the
same blocks) and the model name a peer router must ask for. Both kinds speak the vLLM HTTP API,
so every arm, rollbank's and the peers', runs unchanged on either.

- ``vllm``: :class:`~rollbank.inference.server.ManagedServers` with ``--model`` (CPU: each
  engine's OpenMP threads are bound to their own cores by the host plan, one core each on a
  2-core host, but every server's HTTP front end and engine-core process, the client and any
  peer router float over the same cores; the summary says how much of the time to first token
  is spent outside the engine).
- ``accel-sim``: :class:`~rollbank_bench.accelsim.process.AccelSimServers` with ``--profile``
  (each process an independent emulated accelerator with its own step loop and finite prefix
  cache; almost no CPU).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from rollbank.inference.protocol import InferenceClient

ENGINES = ("vllm", "accel-sim")


@dataclass(frozen=True)
class Fleet:
    engine: str
    label: str  # model (vllm) or profile (accel-sim)
    urls: list[str]
    clients: Sequence[InferenceClient]
    vocab: tuple[int, int]  # token ids [lo, hi) that avoid special tokens
    block_size: int
    served_name: str


@asynccontextmanager
async def open_fleet(args: argparse.Namespace) -> AsyncIterator[Fleet]:
    if args.engine == "accel-sim":
        from rollbank_bench.accelsim.process import AccelSimServers
        from rollbank_bench.accelsim.profile import load_profile

        profile = load_profile(args.profile)
        async with AccelSimServers(args.profile, args.servers, served_model="accelsim") as sims:
            yield Fleet("accel-sim", profile.name, sims.urls, sims.clients,
                        (16, profile.vocab_size), profile.block_size, "accelsim")
        return
    from rollbank.inference.config import ServerConfig
    from rollbank.inference.server import ManagedServers

    cfg = ServerConfig.model_validate({
        "model": args.model, "num_servers": args.servers, "kv_cache_gib": args.kv_cache_gib,
        "extra_args": ["--block-size", str(args.block_size)],
    })
    async with ManagedServers(cfg) as fleet:
        assert fleet.model_dir is not None
        model_cfg = json.loads((fleet.model_dir / "config.json").read_text())
        yield Fleet("vllm", args.model, fleet.urls, fleet.clients,
                    (16, int(model_cfg["vocab_size"])), args.block_size, Path(cfg.model).name)
