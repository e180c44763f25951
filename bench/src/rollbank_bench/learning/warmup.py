"""Supervised warm-up: fit the random tiny model to the action format before RL.

The tiny local model (:func:`rollbank.inference.models.ensure_model` ``"tiny"``) has random
weights: it never emits ``echo N > answer.txt`` on its own, so every GRPO group would have
reward 0 and zero variance. The warm-up trains it (full fine-tuning, token cross-entropy on the
action tokens only, AdamW) on correct actions of tasks drawn from a seed stream of its own
(``learning/warmup``), for a fixed, deliberately short number of steps: long enough that the
format is learned and some answers are right, short enough that the solve rate stays well
below 1 so that RL has something to learn (the measured start rate is in the bench JSON).

The result is an HF folder (weights + tokenizer) cached under
``cache_dir()/learning/warmup-<key>``, keyed by the settings, so every arm and every seed
starts from the same weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from rollbank.config import cache_dir
from rollbank.inference.models import ensure_model
from rollbank_bench.learning.policy import EOS, PAD, TextCodec
from rollbank_bench.learning.tasks import sample_task


def warmup_dir(steps: int, batch: int, lr: float, seed: int) -> Path:
    key = hashlib.sha256(json.dumps([steps, batch, lr, seed, 1]).encode()).hexdigest()[:12]
    return cache_dir() / "learning" / f"warmup-{key}"


def _batch(codec: TextCodec, rng: random.Random, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, masks = [], []
    for _ in range(n):
        task = sample_task(rng)
        p = codec.prompt_ids(task.prompt)
        a = [*codec.ids(task.action), EOS]
        rows.append(p + a)
        masks.append([0] * len(p) + [1] * len(a))
    width = max(len(r) for r in rows)
    ids = torch.full((n, width), PAD, dtype=torch.int64)
    attn = torch.zeros_like(ids)
    mask = torch.zeros((n, width), dtype=torch.float32)
    for i, (r, m) in enumerate(zip(rows, masks, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids, attn, mask


def warm_up(*, steps: int, batch: int = 64, lr: float = 3e-3, seed: int = 0,
            log: Any = None) -> tuple[Path, dict[str, Any]]:
    """The warmed-up model folder (built once, then cached) and what the warm-up did."""
    out = warmup_dir(steps, batch, lr, seed)
    meta_path = out / "rollbank_warmup.json"
    if meta_path.is_file():
        return out, dict(json.loads(meta_path.read_text()))
    from transformers import AutoModelForCausalLM

    base = ensure_model("tiny")
    codec = TextCodec(base)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(f"learning/warmup/{seed}")
    t0 = time.perf_counter()
    losses = []
    for step in range(steps):
        ids, attn, mask = _batch(codec, rng, batch)
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1), reduction="none")
        m = mask[:, 1:].reshape(-1)
        loss = (nll * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.item()))
        if log is not None and (step + 1) % 50 == 0:
            log(f"warm-up step {step + 1}/{steps}: loss {loss.item():.3f}")
    meta = {"base": "tiny", "steps": steps, "batch": batch, "lr": lr, "seed": seed,
            "seconds": time.perf_counter() - t0, "final_loss": losses[-1] if losses else None,
            "loss_every_50": losses[::50]}
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")  # concurrent warm-ups: no shared tmp
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (base / name).is_file():
            shutil.copy2(base / name, tmp / name)
    (tmp / "rollbank_warmup.json").write_text(json.dumps(meta, indent=2))
    if meta_path.is_file():  # another process finished the same warm-up first: use its folder
        shutil.rmtree(tmp, ignore_errors=True)
        return out, dict(json.loads(meta_path.read_text()))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out, meta
