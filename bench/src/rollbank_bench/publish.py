"""Weight publication latency and apply pause per pattern x in-flight plan, under load.

For each pattern (checkpoint, direct, lora on a managed vLLM server; colocated in this
process) and in-flight plan, publish ``--publications`` new weight versions of the tiny model
while ``--load`` generation loops keep the engine busy, and report p50/p95 of the publication
latency (new weights ready -> engine serving them), the apply pause (generation stopped) and
the tokens the engine generated during each publication. Full-model updates send every
tensor (no compaction); LoRA updates are new random adapters of rank 8. Variants
(``direct-unstaged``, ``direct-reload``, ``direct-salted``, ``checkpoint-salted``,
``colocated-reload``, ``lora-paused``, ``lora-reset``) run in the same session so a before/after comparison shares the
machine's load; each record's ``steps_s`` splits the pause (trainer side); with
``--server-logs`` the worker's own ``rollbank_shm`` timings are added as ``worker_log``. The
host's load average is recorded at the start and end of every pattern (a loaded host's
timings are not an idle host's). ``--from-train RUN...`` reports instead what the training loop
recorded (``train.jsonl`` of ``rollbank train`` runs, e.g. one with ``--publisher colocated``
beside one with ``--publisher checkpoint``), in the same shape.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from rollbank.inference.publishing import InflightPlan

PATTERN_PLANS: dict[str, tuple[str, ...]] = {
    "checkpoint": ("finish", "pause"),
    "direct": ("pause", "finish"),
    "lora": ("finish", "abort"),
    "colocated": ("pause", "abort"),
    # variants, for before/after comparisons in one run:
    # direct-unstaged: the earliest order (start + load from /dev/shm + finish all in the pause)
    "direct-unstaged": ("pause",),
    # direct-reload: buffer copied into the worker before the pause, the live model reloaded in
    # it (the order before the worker-side staged reload; "direct" now swaps a prepared shadow)
    "direct-reload": ("pause",),
    # colocated-reload: the live model reloaded under the lock (no staged reload)
    "colocated-reload": ("pause",),
    # *-salted: requests carry cache_salt = their weight version and the pause plan skips the
    # prefix-cache reset (a new version never hits an older version's blocks)
    "direct-salted": ("pause",),
    "checkpoint-salted": ("pause",),
    # lora-paused: the abort plan through the engine's pause + resume (now: client-side
    # aborts of the old adapter's requests, no engine pause); lora-reset: that and the
    # prefix-cache reset, as before 2026-12-01 (now skipped: the hashes cover the adapter)
    "lora-paused": ("abort",),
    "lora-reset": ("abort",),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--json", action="store_true", help="print one JSON object (the default output anyway)")
    a("--patterns", default="checkpoint,direct,lora,colocated", help="comma-separated patterns")
    a("--plans", default=None, help="comma-separated in-flight plans (default: each pattern's usual ones)")
    a("--publications", type=int, default=5, help="publications per pattern x plan")
    a("--load", type=int, default=4, help="concurrent generation loops during the publications")
    a("--max-tokens", type=int, default=64, help="tokens per load request")
    a("--model", default="tiny", help="model of the engines ('tiny', 'gemma-3-270m')")
    a("--out", type=Path, default=None, help="also write the JSON here")
    a("--interleave", action="store_true",
      help="lora variants only (lora, lora-paused, lora-reset): one publisher, the variants "
      "taken in turn publication by publication, so a changing host load weighs on each alike")
    a("--server-logs", type=Path, default=None,
      help="keep the managed server's log here (rollbank_shm logs its worker-side apply times)")
    a("--from-train", type=Path, nargs="+", default=None, metavar="RUN",
      help="report the publications `rollbank train` recorded in each RUN/train.jsonl (one run "
      "per pattern, e.g. --publisher colocated and --publisher checkpoint) instead of measuring: "
      "the loop's own records, latency from the trainer step's end, side by side")


def _dtype(model: str) -> str | None:
    return "float32" if model == "tiny" else None  # tiny is fp32; others serve their own dtype


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p95 per measure. ``apply_pause_s`` runs from the pause *request* to the resume's
    answer, so it includes the wait for the engine step in progress (still generating);
    ``after_pause_ack_s`` starts at the pause's answer (the engine has stopped) instead.
    ``steps_p50_s``: the median of every step of ``steps_s`` (the in-pause breakdown)."""
    pub = [float(r["publication_s"]) for r in records]
    pause = [float(r["apply_pause_s"]) for r in records]
    acked = [float(r["apply_pause_s"]) - float(r["steps_s"].get("pause_s", 0.0)) for r in records]
    toks = [float(r["tokens_during"]) for r in records if "tokens_during" in r]
    names = sorted({k for r in records for k in r["steps_s"] if k.endswith("_s")})
    return {
        "n": len(records),
        "publication_s": {"p50": _pct(pub, 0.5), "p95": _pct(pub, 0.95)},
        "apply_pause_s": {"p50": _pct(pause, 0.5), "p95": _pct(pause, 0.95)},
        "after_pause_ack_s": {"p50": _pct(acked, 0.5), "p95": _pct(acked, 0.95)},
        "steps_p50_s": {k: _pct([float(r["steps_s"][k]) for r in records if k in r["steps_s"]], 0.5)
                        for k in names},
        "tokens_during_publication": {"p50": _pct(toks, 0.5), "p95": _pct(toks, 0.95)},
        "bytes": records[0]["bytes"] if records else 0,
        "failed": sum(not r["ok"] for r in records),
    }


def from_train(runs: list[Path]) -> dict[str, Any]:
    """The ``publication`` records of each run's ``train.jsonl`` (the training loop's own),
    summarized per pattern x plan as the measured results are. ``publication_s`` is the loop's
    (its trainer step done -> every engine serving the version, queueing included), the apply
    pause and the in-pause steps are the publisher's record (``detail``)."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    sources: dict[str, list[str]] = {}
    for run in runs:
        path = run / "train.jsonl"
        if not path.is_file():
            raise SystemExit(f"{path}: no train.jsonl (is {run} a `rollbank train` output folder?)")
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") != "publication":
                continue
            detail = rec.get("detail") or {}
            key = f"{detail.get('pattern', rec.get('pattern', '?'))}/{detail.get('plan', '?')}"
            grouped.setdefault(key, []).append({
                "version": rec["version"], "publication_s": rec["publication_s"],
                "apply_pause_s": rec["apply_pause_s"], "steps_s": detail.get("steps_s", {}),
                "bytes": detail.get("bytes", 0), "tensors": detail.get("tensors", 0),
                "ok": detail.get("ok", True)})
            if str(run) not in sources.setdefault(key, []):
                sources[key].append(str(run))
    return {key: {"pattern": key.split("/")[0], "plan": key.split("/")[1], "source": "train.jsonl",
                  "runs": sources[key], **summarize(recs), "records": recs}
            for key, recs in grouped.items()}


def random_lora(model_dir: Path, out: Path, *, seed: int, rank: int = 8) -> Path:
    """A random PEFT adapter (q_proj, v_proj) for any model, from its safetensors headers."""
    import torch
    from safetensors.torch import save_file

    from rollbank.inference.publishing.state import read_safetensors_meta

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (shape, _) in read_safetensors_meta(model_dir).items():
        if name.endswith(("q_proj.weight", "v_proj.weight")) and len(shape) == 2:
            stem = "base_model.model." + name.removesuffix(".weight")
            tensors[stem + ".lora_A.weight"] = 0.1 * torch.randn(rank, shape[1], generator=g)
            tensors[stem + ".lora_B.weight"] = 0.1 * torch.randn(shape[0], rank, generator=g)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model_dir),
        "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"], "bias": "none"}))
    return out


def _new_state(base: dict[str, Any], seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {n: t + 0.01 * torch.randn(t.shape, generator=g) for n, t in base.items()}


async def _remote(args: argparse.Namespace, patterns: list[str], plans: list[str] | None,
                  workdir: Path) -> dict[str, Any]:
    from rollbank.inference.config import ServerConfig
    from rollbank.inference.models import ensure_model
    from rollbank.inference.protocol import GenerateRequest, SamplingParams
    from rollbank.inference.publishing import (
        CheckpointPublisher,
        DirectPublisher,
        LoraPublisher,
        ServedWeights,
        WeightUpdate,
    )
    from rollbank.inference.server import ManagedServers

    model_dir = ensure_model(args.model)
    cfg = ServerConfig(model=args.model, dtype=_dtype(args.model), enable_lora=True, kv_cache_gib=1,
                       weight_transfer_backend="rollbank_shm",
                       run_dir=args.server_logs or workdir / "servers")
    results: dict[str, Any] = {}
    async with ManagedServers(cfg) as ms:
        client = ms.clients[0]
        served = ServedWeights.from_checkpoint(model_dir)
        base = dict(served.tensors)
        lora_name: list[str | None] = [None]
        stop = asyncio.Event()

        async def load_loop(i: int) -> None:
            rng = random.Random(i)
            n = 0
            while not stop.is_set():
                prompt = [rng.randrange(3, 2000) for _ in range(32)]  # ids valid in both vocabularies
                n += 1
                with contextlib.suppress(Exception):
                    await client.generate(GenerateRequest(
                        f"load-{i}-{n}", prompt, SamplingParams(max_tokens=args.max_tokens),
                        lora=lora_name[0]))

        version = await client.engine_version()
        seed = 100
        if args.interleave:
            if not all(p.startswith("lora") for p in patterns):
                raise SystemExit("--interleave takes lora variants only (lora, lora-paused, lora-reset)")
            plan_i = cast("InflightPlan", (plans or ["abort"])[0])
            mixed = LoraPublisher([client], plan=plan_i, version=version, max_rank=8, prefix="mixed")
            by: dict[str, list[dict[str, Any]]] = {p: [] for p in patterns}
            load_start = _loadavg()
            loops = [asyncio.create_task(load_loop(i)) for i in range(args.load)]
            try:
                await asyncio.sleep(1.0)
                for k in range(args.publications * len(patterns)):
                    pattern = patterns[k % len(patterns)]
                    lora_variant(mixed.fleet, pattern)
                    path = await asyncio.to_thread(random_lora, model_dir, workdir / f"lora-{k}", seed=k)
                    ready = time.monotonic()
                    before = (await client.metrics()).generation_tokens
                    rec = await mixed.publish(WeightUpdate(path=str(path), lora=True),
                                              version=version + k + 1, ready_at=ready)
                    lora_name[0] = mixed.adapter
                    d = rec.to_dict()
                    d["tokens_during"] = (await client.metrics()).generation_tokens - before
                    d["loadavg"] = _loadavg()[0]
                    by[pattern].append(d)
                    await asyncio.sleep(0.3 if k % 2 else 0.1)
            finally:
                await _stop_load(stop, loops)
            return {f"{p}/{plan_i}": {"pattern": p, "plan": plan_i, "update": "lora", "interleaved": True,
                                      "loadavg": {"start": load_start, "end": _loadavg()},
                                      **summarize(r), "records": r} for p, r in by.items()}
        for pattern in patterns:
            for plan in plans or PATTERN_PLANS[pattern]:
                if plan not in PATTERN_PLANS[pattern]:
                    continue
                plan_t = cast("InflightPlan", plan)
                pub: Any
                salted = pattern.endswith("-salted")
                client.salt_by_version = salted
                if pattern.startswith("checkpoint"):
                    pub = CheckpointPublisher([client], model_dir, root=workdir / "ckpt", plan=plan_t,
                                              version=version)
                elif pattern.startswith("direct"):
                    served.commit(base)
                    pub = DirectPublisher([client], served, plan=plan_t, compact=False,
                                          version=version, stage=pattern != "direct-unstaged",
                                          prepare=pattern != "direct-reload")
                else:
                    pub = LoraPublisher([client], plan=plan_t, version=version, max_rank=8,
                                        prefix=f"{pattern}-{plan}")
                    lora_variant(pub.fleet, pattern)
                pub.fleet.keep_kv = salted
                load_start = _loadavg()
                stop.clear()
                loops = [asyncio.create_task(load_loop(i)) for i in range(args.load)]
                records = []
                try:
                    await asyncio.sleep(1.0)  # let the load reach steady state
                    for k in range(args.publications):
                        seed += 1
                        version += 1
                        if pattern.startswith("lora"):
                            path = await asyncio.to_thread(random_lora, model_dir,
                                                           workdir / f"lora-{seed}", seed=seed)
                            update = WeightUpdate(path=str(path), lora=True)
                            ready = time.monotonic()
                        else:
                            state = await asyncio.to_thread(_new_state, base, seed)
                            ready = time.monotonic()
                            update = WeightUpdate(tensors=state)
                        before = (await client.metrics()).generation_tokens
                        rec = await pub.publish(update, version=version, ready_at=ready)
                        after = (await client.metrics()).generation_tokens
                        if pattern.startswith("lora"):
                            lora_name[0] = pub.adapter
                        d = rec.to_dict()
                        d["tokens_during"] = after - before
                        records.append(d)
                        await asyncio.sleep(0.3 if k % 2 else 0.1)
                finally:
                    await _stop_load(stop, loops)
                    await pub.aclose()
                lora_name[0] = None
                client.salt_by_version = False
                results[f"{pattern}/{plan}"] = {"pattern": pattern, "plan": plan, "cache_salt": salted,
                                                "update": "lora" if pattern.startswith("lora") else "full",
                                                "loadavg": {"start": load_start, "end": _loadavg()},
                                                **summarize(records), "records": records}
        # leave the base weights (the server stops anyway)
    return results


def lora_variant(fleet: Any, pattern: str) -> None:
    """The fleet settings of a lora variant: ``lora`` = the current ones (abort plan: no
    engine pause; no prefix-cache reset), ``lora-paused`` = engine pause + resume,
    ``lora-reset`` = that and the reset (the order before 2026-12-01)."""
    fleet.abort_only = fleet.plan == "abort" and pattern == "lora"
    fleet.reset_cache = pattern == "lora-reset"



async def _stop_load(stop: asyncio.Event, loops: list[asyncio.Task[None]]) -> None:
    """End the generation-load loops a measurement ran beside."""
    stop.set()
    for t in loops:
        t.cancel()
    await asyncio.gather(*loops, return_exceptions=True)

def _loadavg() -> list[float]:
    import os

    return [round(x, 2) for x in os.getloadavg()]


def _worker_log(logs: Path | None) -> list[str]:
    """The worker's ``rollbank_shm`` lines (its own timings) from the managed server's logs."""
    if logs is None or not logs.exists():
        return []
    return [line.strip() for f in sorted(logs.rglob("*.log"))
            for line in f.read_text(errors="replace").splitlines() if "rollbank_shm:" in line]


def _colocated(args: argparse.Namespace, patterns: list[str], plans: list[str] | None) -> dict[str, Any]:
    import vllm

    from rollbank.inference.models import ensure_model
    from rollbank.inference.publishing import (
        ColocatedEngine,
        ColocatedPublisher,
        ServedWeights,
        WeightUpdate,
    )

    model_dir = ensure_model(args.model)
    engine = ColocatedEngine(model_dir, dtype=_dtype(args.model) or "auto", max_model_len=512, kv_cache_gib=1)
    served = ServedWeights.from_checkpoint(model_dir)
    base = dict(served.tensors)
    results: dict[str, Any] = {}
    for pattern, plan in [(pt, pl) for pt in patterns for pl in plans or PATTERN_PLANS[pt]]:
        if plan not in PATTERN_PLANS[pattern]:
            continue
        served.commit(base)
        pub = ColocatedPublisher(engine, served, plan=cast("InflightPlan", plan), compact=False,
                                 stage=pattern != "colocated-reload")
        load_start = _loadavg()
        stop = threading.Event()

        def load(i: int, stop: threading.Event = stop) -> None:
            rng = random.Random(i)
            params = vllm.SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
            while not stop.is_set():
                engine.generate([[rng.randrange(3, 2000) for _ in range(32)] for _ in range(args.load)], params)

        th = threading.Thread(target=load, args=(0,), daemon=True)
        th.start()
        records = []
        try:
            time.sleep(1.0)
            for k in range(args.publications):
                state = _new_state(base, 1000 + k)
                ready = time.monotonic()
                before = engine.tokens_generated
                rec = asyncio.run(pub.publish(WeightUpdate(tensors=state), version=k + 1, ready_at=ready))
                d = rec.to_dict()
                d["tokens_during"] = engine.tokens_generated - before
                records.append(d)
                time.sleep(0.3 if k % 2 else 0.1)
        finally:
            stop.set()
            th.join()
        results[f"{pattern}/{plan}"] = {"pattern": pattern, "plan": plan, "update": "full",
                                        "loadavg": {"start": load_start, "end": _loadavg()},
                                        **summarize(records), "records": records}
    return results


def run(args: argparse.Namespace) -> int:
    import os
    import tempfile

    patterns = [p.strip() for p in args.patterns.split(",") if p.strip()]
    unknown = set(patterns) - set(PATTERN_PLANS)
    if unknown:
        raise SystemExit(f"unknown patterns {sorted(unknown)}; choose from {sorted(PATTERN_PLANS)}")
    plans = [p.strip() for p in args.plans.split(",")] if args.plans else None
    if args.from_train:
        loop_report = {"source": "rollbank train's publication records",
                       "host": {"cpus": os.cpu_count()}, "results": from_train(list(args.from_train))}
        text = json.dumps(loop_report, indent=2, default=str)
        print(text)
        if args.out is not None:
            args.out.write_text(text + "\n")
        return 0
    report: dict[str, Any] = {"model": args.model, "load": args.load, "max_tokens": args.max_tokens,
                              "publications": args.publications,
                              "host": {"cpus": os.cpu_count(), "loadavg_start": _loadavg()}, "results": {}}
    with tempfile.TemporaryDirectory(prefix="rollbank-bench-publish-") as tmp:
        remote = [p for p in patterns if not p.startswith("colocated")]
        if remote:
            report["results"].update(asyncio.run(_remote(args, remote, plans, Path(tmp))))
        local = [p for p in patterns if p.startswith("colocated")]
        if local:
            report["results"].update(_colocated(args, local, plans))
    report["host"]["loadavg_end"] = _loadavg()
    if lines := _worker_log(args.server_logs):
        report["worker_log"] = lines
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0
