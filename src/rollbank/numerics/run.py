"""One ``rollbank numerics`` run: engines (one managed vLLM server at a time, one per dtype),
then trainers, then the report (``numerics.json`` + ``numerics.png`` in the output folder).

The first engine dtype samples the sequences (its decode log-probs are the behaviour
log-probs a batch would carry); every engine then scores all sequences with prompt
log-probs; every trainer variant scores them with :meth:`Trainer.logprobs`.
"""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbank.inference.config import ServerConfig
from rollbank.inference.host import detect_host
from rollbank.inference.models import ensure_model
from rollbank.inference.server import ManagedServers
from rollbank.inference.tokenizer import load_tokenizer
from rollbank.numerics.measure import (
    PROMPTS,
    TRAINER_VARIANTS,
    FloatArray,
    Sequences,
    comparisons,
    engine_prefill,
    sample,
    trainer_logprobs,
)

SHORT = {"float32": "fp32", "bfloat16": "bf16"}


@dataclass(frozen=True)
class NumericsPlan:
    """What one run measures."""

    model: str = "tiny"
    engine_dtypes: tuple[str, ...] = ("bfloat16", "float32")
    trainer_variants: tuple[str, ...] = tuple(TRAINER_VARIANTS)
    prompts: int = 8
    max_tokens: int = 256
    compile: str = "inductor"
    kv_cache_gib: float = 1.0
    threads: int | None = None
    out: Path = field(default_factory=lambda: Path("numerics-out"))


def prompt_ids(model: str, count: int) -> list[list[int]]:
    """The first ``count`` of :data:`PROMPTS` (cycled), tokenized with BOS when the model has one."""
    tok = load_tokenizer(ensure_model(model))
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    return [bos + tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(count)]


async def engine_sources(plan: NumericsPlan) -> tuple[Sequences, dict[str, FloatArray], dict[str, Any]]:
    """Start one server per dtype in turn (stopped before the next starts); sample with the
    first; score with all."""
    prompts = prompt_ids(plan.model, plan.prompts)
    seqs: Sequences | None = None
    sources: dict[str, FloatArray] = {}
    meta: dict[str, Any] = {}
    for dtype in plan.engine_dtypes:
        name = f"engine-{SHORT.get(dtype, dtype)}"
        longest = max(len(p) for p in prompts) + plan.max_tokens
        cfg = ServerConfig(model=plan.model, dtype=dtype, num_servers=1, kv_cache_gib=plan.kv_cache_gib,
                           compile=plan.compile,  # type: ignore[arg-type]
                           max_model_len=max(256, 64 * math.ceil((longest + 8) / 64)),
                           run_dir=plan.out / f"server-{SHORT.get(dtype, dtype)}",
                           threads=plan.threads or "auto")
        t0 = time.monotonic()
        async with ManagedServers(cfg) as servers:
            started = time.monotonic() - t0
            client = servers.clients[0]
            if seqs is None:
                seqs, decode = await sample(client, prompts, max_tokens=plan.max_tokens)
                sources[f"{name}-decode"] = decode
            sources[f"{name}-prefill"] = await engine_prefill(client, seqs, tag=name)
        meta[name] = {"dtype": dtype, "compile": plan.compile, "startup_s": round(started, 1),
                      "total_s": round(time.monotonic() - t0, 1)}
    assert seqs is not None
    return seqs, sources, meta


def trainer_sources(plan: NumericsPlan, seqs: Sequences) -> tuple[dict[str, FloatArray], dict[str, Any]]:
    out: dict[str, FloatArray] = {}
    meta: dict[str, Any] = {}
    for name in plan.trainer_variants:
        dtype, fp32_head = TRAINER_VARIANTS[name]
        t0 = time.monotonic()
        out[name] = trainer_logprobs(plan.model, seqs, dtype=dtype, fp32_head=fp32_head,
                                     threads=plan.threads)
        meta[name] = {"dtype": dtype, "fp32_lm_head": fp32_head, "seconds": round(time.monotonic() - t0, 1)}
    return out, meta


def build_report(plan: NumericsPlan, seqs: Sequences, sources: dict[str, FloatArray],
                 meta: dict[str, Any]) -> dict[str, Any]:
    behaviour = next((k for k in sources if k.endswith("-decode")), None)
    facts = detect_host()
    return {
        "model": plan.model,
        "host": {"cpu": facts.cpu_model, "isa": facts.isa, "cores": facts.cores,
                 "python": platform.python_version()},
        "sequences": len(seqs.prompts),
        "sampled_tokens": sum(len(s) for s in seqs.sampled),
        "max_tokens": plan.max_tokens,
        "behaviour": behaviour,
        "sources": meta,
        **comparisons(seqs, sources, behaviour=behaviour),
    }


def write_outputs(report: dict[str, Any], out: Path, *, plot: bool = True) -> list[Path]:
    """``numerics.json`` (and ``numerics.png`` if ``plot``) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "numerics.json"
    path.write_text(json.dumps(report, indent=1, sort_keys=False) + "\n")
    paths = [path]
    if plot:
        from rollbank.numerics.plot import plot_report

        paths.append(plot_report(report, out / "numerics.png"))
    return paths


def headline(report: dict[str, Any], names: Sequence[str] | None = None) -> list[str]:
    """One line per comparison: mean/max |delta|, k3, share over 0.1 / 0.5 nats."""
    lines = []
    for name, c in report["comparisons"].items():
        if names is not None and name not in names:
            continue
        a = c["abs"]
        lines.append(f"{name:48s} mean {a['mean']:.2e}  max {a['max']:.2e}  k3 {a['k3']:.2e}  "
                     f">0.1 {a['share_over']['0.1']:.4f}  >0.5 {a['share_over']['0.5']:.4f}")
    return lines
