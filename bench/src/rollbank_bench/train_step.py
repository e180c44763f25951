"""Time and peak memory of one built-in trainer step (Gemma 3 270M + LoRA by default).

Builds a synthetic batch (``--rows`` x ``--tokens``: a ``--prompt``-token prompt, the rest
model-sampled tokens, random ids, advantages +1/-1), loads the policy with
:class:`~rollbank.training.trainer.Trainer`, runs ``--steps`` optimizer steps with
micro-batching, and prints JSON: load seconds, seconds per step, trained tokens per second,
peak RSS after loading and after the steps (``ru_maxrss``, whole process), the process CPU
seconds of each step (all threads; robust to other load on the machine) and the 1-minute
load average before and after the steps (to judge how contended the wall time was). The ratio is
taken against the trainer's own recompute (``ratio_against = "recompute"``) so every token
carries gradient, as in an on-policy GRPO step; the cost is the same for ``"behaviour"``.
A measurement, not a test: it is heavy (tens of seconds, several GiB for Gemma).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Any

GIB = 1024**3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="gemma-3-270m", help="'tiny', 'gemma-3-270m' or a folder")
    parser.add_argument("--finetune", choices=("lora", "full"), default="lora")
    parser.add_argument("--rows", type=int, default=4, help="trajectories in the batch")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per trajectory")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens (not trained)")
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--logprob-chunk", type=int, default=256, help="LM-head positions per chunk")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", action="store_true", help="JSON only (the default output anyway)")


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # KiB on Linux


def _batch(rows: int, tokens: int, prompt: int, vocab: int) -> Any:
    import torch

    from rollbank.batching.loader import TensorBatch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, tokens), generator=g)
    mask = torch.zeros(rows, tokens, dtype=torch.float32)
    mask[:, prompt:] = 1.0
    versions = torch.where(mask > 0, 0, -1).to(torch.int32)
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(rows)])
    return TensorBatch(
        input_ids=ids, attention_mask=torch.ones(rows, tokens, dtype=torch.int64),
        loss_mask=mask, old_logprobs=torch.zeros(rows, tokens), policy_versions=versions,
        advantages=adv, rewards=(adv > 0).float(), prompt_lens=torch.full((rows,), prompt),
        group_index=torch.zeros(rows, dtype=torch.int64),
        trajectory_ids=tuple(f"bench/s{i}/r0" for i in range(rows)),
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from rollbank.training.config import LoraSettings, TrainerConfig
    from rollbank.training.logprobs import causal_lm
    from rollbank.training.trainer import Trainer

    config = TrainerConfig(
        model=args.model, finetune=args.finetune, dtype=args.dtype, lr=1e-5,
        micro_batch_size=args.micro_batch_size, logprob_chunk=args.logprob_chunk,
        lora=LoraSettings(rank=args.lora_rank, alpha=2.0 * args.lora_rank),
        gradient_checkpointing=args.gradient_checkpointing, ratio_against="recompute",
        threads=args.threads,
    )
    rss_start = _peak_rss_gib()
    t0 = time.perf_counter()
    trainer = Trainer.load(config)
    load_s = time.perf_counter() - t0
    rss_load = _peak_rss_gib()
    vocab = int(causal_lm(trainer.model).config.vocab_size)
    batch = _batch(args.rows, args.tokens, args.prompt, vocab)
    steps, cpu_s = [], []
    load_avg = os.getloadavg()[0]
    for _ in range(args.steps):
        c0 = time.process_time()
        result = trainer.step(batch)
        cpu_s.append(time.process_time() - c0)
        steps.append(result.metrics.to_dict())
    step_s = [float(s["seconds"]) for s in steps]
    import torch

    return {
        "model": args.model, "finetune": args.finetune, "dtype": args.dtype,
        "batch": [args.rows, args.tokens], "model_tokens": int(batch.loss_mask.sum().item()),
        "micro_batch_size": args.micro_batch_size, "logprob_chunk": args.logprob_chunk,
        "gradient_checkpointing": args.gradient_checkpointing, "vocab_size": vocab,
        "trainable_params": trainer.trainable_parameters, "torch_threads": torch.get_num_threads(),
        "load_s": round(load_s, 3), "step_s": [round(s, 3) for s in step_s],
        "step_cpu_s": [round(s, 3) for s in cpu_s],
        "load_average_1m": [round(load_avg, 2), round(os.getloadavg()[0], 2)],
        "tokens_per_s": round(args.rows * args.tokens / min(step_s), 1) if step_s else None,
        "peak_rss_gib": {"start": round(rss_start, 3), "after_load": round(rss_load, 3),
                         "after_steps": round(_peak_rss_gib(), 3)},
        "steps": steps,
    }


def run(args: argparse.Namespace) -> int:
    if args.prompt >= args.tokens:
        print("--prompt must be < --tokens", file=sys.stderr)
        return 2
    print(json.dumps(measure(args), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollbank bench train-step", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
