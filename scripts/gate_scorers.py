"""Measure the staleness gate's two scorers on the same sampled sequences (docs/staleness.md).

    PYTHONPATH=src python scripts/gate_scorers.py --model gemma-3-270m --dtype auto --out /tmp/x.json

Starts one managed vLLM CPU server, samples ``--n`` completions of ``--tokens`` tokens, then
scores them three times each with the engine scorer (prompt log-probs) and the trainer scorer
(fp32 recompute) and prints the agreement in nats over the sampled tokens and the seconds
per token (best of three; the host is shared, so read them as orders of magnitude).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from rollbank.episodes.trajectory import Trajectory
from rollbank.inference.config import ServerConfig
from rollbank.inference.protocol import GenerateRequest, SamplingParams
from rollbank.inference.server import ManagedServers
from rollbank.scheduling.drivers.scoring import EngineScorer


async def measure(model: str, dtype: str, n: int, tokens: int, run_dir: Path) -> dict[str, Any]:
    from rollbank.training.config import TrainerConfig
    from rollbank.training.scorer import TrainerScorer
    from rollbank.training.trainer import Trainer

    cfg = ServerConfig(model=model, dtype=dtype, kv_cache_gib=1, run_dir=run_dir)
    async with ManagedServers(cfg) as ms:
        client = ms.clients[0]
        trajs = []
        for i in range(n):
            prompt = [10 + (37 * i + j) % 5000 for j in range(64)]
            r = await client.generate(GenerateRequest(f"m{i}", prompt, SamplingParams(
                max_tokens=tokens, min_tokens=tokens, temperature=1.0)))
            t = Trajectory(trajectory_id=f"m{i}", group_id="m", task_id="m", attempt=i)
            t.append_prompt(prompt)
            t.prompt_len = len(prompt)
            t.append_model(list(r.token_ids), list(r.logprobs), list(r.token_versions))
            trajs.append(t)
        engine = EngineScorer([client])
        engine_runs = []
        for _ in range(3):
            t0 = time.monotonic()
            by_engine = await engine.score(trajs)
            engine_runs.append(time.monotonic() - t0)
        served = ms.plan.dtype or dtype
    trainer = await asyncio.to_thread(
        Trainer.load, TrainerConfig(model=model, finetune="full", dtype="float32"))
    scorer = TrainerScorer(trainer, lambda: by_engine.version)
    trainer_runs = []
    for _ in range(3):
        by_trainer = await scorer.score(trajs)
        trainer_runs.append(by_trainer.seconds)
    d = np.concatenate([
        np.abs(np.asarray(by_engine.logprobs[t.trajectory_id]) - np.asarray(by_trainer.logprobs[t.trajectory_id]))[
            np.asarray(t.loss_mask, dtype=bool)] for t in trajs])
    behaviour = np.concatenate([np.asarray(t.logprobs)[np.asarray(t.loss_mask, dtype=bool)] for t in trajs])
    prefill = np.concatenate([np.asarray(by_engine.logprobs[t.trajectory_id])[np.asarray(t.loss_mask, dtype=bool)]
                              for t in trajs])
    total = sum(len(t.token_ids) for t in trajs)
    return {
        "model": model, "engine_dtype": str(served), "trainer_dtype": "float32",
        "sequences": n, "tokens": total, "sampled_tokens": int(d.size),
        "engine_prefill_vs_trainer_abs_delta_nats": {"mean": float(d.mean()), "max": float(d.max())},
        "engine_prefill_vs_decode_abs_delta_nats": {
            "mean": float(np.abs(prefill - behaviour).mean()), "max": float(np.abs(prefill - behaviour).max())},
        "engine_ms_per_token": 1e3 * min(engine_runs) / total,
        "trainer_ms_per_token": 1e3 * min(trainer_runs) / total,
        "engine_runs_s": engine_runs, "trainer_runs_s": trainer_runs,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="tiny")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--out", type=Path, default=Path("/tmp/rollbank-gate-scorers-model.json"))
    a = p.parse_args()
    run_dir = Path("/tmp") / f"gate-scorers-{a.model}"
    run_dir.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(measure(a.model, a.dtype, a.n, a.tokens, run_dir))
    a.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
