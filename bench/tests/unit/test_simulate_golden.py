"""The simulator's decisions are pinned: fixed-seed runs must reproduce a committed digest.

The hot paths of the scheduler, ready bank, ledger and simulator loop were rewritten for
speed (``rollbank bench schedule --trajectories``); these digests prove that the rewrite took
exactly the same decisions and produced exactly the same batches and accounting.

How the digests were made: ``_digest(scenario, record=...)`` below was run on the code
before the speed-up (commit 7b0a4b1, branch main) and its hex digests were pasted into
``GOLDEN``. A digest covers, in order: every launch (attempt id, task, seed, virtual launch
time, as the workload saw it), the lifecycle events when recorded, every batch (window,
ready time, accounting, selection profile, meta, unreachable tasks and, when kept, each
group's ids, rewards, advantages and trajectories' times) and the result summary. Floats are
hashed by ``repr``: equal to the last bit. If a deliberate policy change moves a digest,
recompute it on the new code and say why in the commit. Recomputed once on the merge of
dynamic sampling: the decision traces were diffed field by field against 7b0a4b1's and the
only differences were added fields (``held`` in group events, ``groups``/``dynamic_sampling``
in batch meta and the summary); no launch, time, reward or accounting changed.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import fields
from typing import Any

import pytest

from rollbank.episodes.outcome import Reason
from rollbank.scheduling.config import (
    ReadyBankConfig,
    SchedulerConfig,
    SchedulingMode,
    StragglerPolicy,
)
from rollbank.scheduling.policy.events import Event
from rollbank.scheduling.policy.types import AttemptSpec
from rollbank.scheduling.sim.sim_model import LatencyProfile, SimCapacity, SimTurn
from rollbank.scheduling.sim.simulate import SimEpisode, SimResult, simulate
from rollbank_bench.schedule import add_arguments, episode_fn, scheduler_config
from rollbank_bench.schedule import capacity as bench_capacity

TASKS = [f"task-{i}" for i in range(12)]


def _episode(spec: AttemptSpec, *, turns: bool) -> SimEpisode:
    """Heavy-tailed, seeded by (seed, retry): infra failures (retried), passes and fails (some
    groups zero-variance), and with ``turns`` generate calls, tool time and a verifier."""
    rng = random.Random(spec.seed * 31 + spec.retry)
    scale = 1.0 + int(spec.task_id.split("-")[1]) % 3
    duration = scale * math.exp(rng.gauss(0.0, 1.0))
    if rng.random() < 0.08:
        return SimEpisode(duration / 3, Reason.SANDBOX_DIED, None)
    passed = rng.random() < (0.9 if spec.key.seq % 5 == 0 else 0.5)
    reason = Reason.VERIFIED_PASS if passed else Reason.VERIFIED_FAIL
    if not turns:
        return SimEpisode(duration, reason, float(passed))
    ts = tuple(SimTurn(rng.randint(8, 64), rng.randint(4, 32), round(rng.uniform(0, 2), 3))
               for _ in range(rng.randint(1, 4)))
    return SimEpisode(0.3, reason, float(passed), turns=ts, verify_s=round(0.2 * scale, 3))


def _config(**kw: Any) -> SchedulerConfig:
    base: dict[str, Any] = {
        "groups_per_batch": 6, "pool_groups": 9, "sandbox_slots": 20, "num_batches": 5,
        "seed": 3, "bank": ReadyBankConfig(group_size=4, max_retries=1, min_valid=2),
    }
    return SchedulerConfig(**(base | kw))


CAP = SimCapacity(2, LatencyProfile("golden", 0.001, 0.01, 0.05))
SCENARIOS: dict[str, tuple[SchedulerConfig, bool]] = {
    "naive": (_config(mode=SchedulingMode.NAIVE, pool_groups=6), False),
    "carry": (_config(), False),
    "abort": (_config(straggler=StragglerPolicy.ABORT, requeue_aborted=True, max_requeues=1,
                      sandbox_slots=14), False),
    "wait": (_config(straggler=StragglerPolicy.WAIT), False),
    "zero_variance": (_config(bank=ReadyBankConfig(group_size=3, max_retries=2, min_valid=2,
                                                   filter_zero_variance=True)), False),
    "contention_naive": (_config(mode=SchedulingMode.NAIVE, pool_groups=6,
                                 inference_slots_per_server=2, verifier_slots=3), True),
    "contention": (_config(inference_slots_per_server=2, verifier_slots=3), True),
    "contention_abort": (_config(inference_slots_per_server=3, verifier_slots=2,
                                 straggler=StragglerPolicy.ABORT, requeue_aborted=True), True),
}


def _plain(x: Any) -> Any:
    """JSON-ready, floats as repr (bit-exact)."""
    if isinstance(x, float):
        return repr(x)
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if hasattr(x, "value") and isinstance(x.value, str):
        return x.value
    return x if x is None or isinstance(x, str | int | bool) else repr(x)


def _result(res: SimResult) -> list[Any]:
    out: list[Any] = []
    for b in res.batches:
        out.append([b.index, b.window_start, b.ready_at, b.complete, b.accounting.to_dict(),
                    b.profile.to_dict(), b.meta, [u.to_dict() for u in b.unreachable]])
        for g in b.groups:
            out.append([g.group_id, g.task_id, g.seq, g.rewards, g.advantages,
                        g.zero_variance, g.size, g.infra_final, g.retries, g.launched_at,
                        g.completed_at,
                        [(t.trajectory_id, t.seed, t.launched_at, t.finished_at,
                          t.num_model_tokens, t.reward) for t in g.trajectories]])
    out.append([(f.name, getattr(res, f.name)) for f in fields(res)
                if f.name not in ("batches", "unreachable")])
    out.append([u.to_dict() for u in res.unreachable])
    return out


def _digest(name: str, *, record: bool) -> str:
    config, turns = SCENARIOS[name]
    launches: list[Any] = []

    def workload(spec: AttemptSpec) -> SimEpisode:
        launches.append((spec.attempt_id, spec.task_id, spec.seed, spec.group_size,
                         spec.launched_at))
        return _episode(spec, turns=turns)

    events: list[Event] | None = [] if record else None
    res = simulate(config, TASKS, workload, capacity=CAP if turns else None, events=events,
                   keep_trajectories=record)
    doc = [launches, [e.to_dict() for e in events or ()], _result(res)]
    return hashlib.sha256(json.dumps(_plain(doc)).encode()).hexdigest()


def _bench_digest(model: str) -> str:
    """The bench's own path (trace workload, ``episode_fn``, ``capacity``), both arms sharing
    the plan memo as ``rollbank bench schedule --trajectories`` runs them."""
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--groups", "8", "--group-size", "4", "--batches", "6",
                         "--model", model, "--servers", "2", "--inference-slots", "4",
                         "--verifier-slots", "5"])
    memo: dict[int, Any] = {}
    doc = []
    for naive in (True, False):
        cfg = scheduler_config(args, 0, naive=naive, slots=24, pool=12)
        res = simulate(cfg, TASKS, episode_fn(args, 0, memo), capacity=bench_capacity(args),
                       keep_trajectories=False)
        doc.append(_result(res))
    return hashlib.sha256(json.dumps(_plain(doc)).encode()).hexdigest()


GOLDEN: dict[str, str] = {
    "abort/record": "0bd373703de66f59bbdfc63edca598cab9b22fff992eb3c1c940210b8a6d2e10",
    "abort/lean": "f43898921b1ea052cb7d977d5815207e1540074cb471cd10b43552f3c0ae918d",
    "carry/record": "4bee130dd86ca5d98fd6af352dd4fa73faa06b1f54a59638ef76523694dfe409",
    "carry/lean": "15dcc7a38394b236a6ed1c4637915b06a88536da85faa3202afcf11bc8baedf7",
    "contention/record": "65e2d8d5c75a83051f75924034967e40ee893f58619bad06a28e0449d8ae3a63",
    "contention/lean": "fef72992b5666e03d622b4fdb67c02c2cf2b8d33a5b377f3f9151f2d813c90fb",
    "contention_abort/record": "cd79fa200291e728b3098bb3b9896c78ce089d1f32e24dacd7d99a3a58234be3",
    "contention_abort/lean": "6d54d52627628451e600638eda72c261666b0c29cd6206c293574c62a3765f0b",
    "contention_naive/record": "600fb8e4afeb8feb96f6fd2460f362ce1db2413f518f51ef1ace28d4a8cedd7d",
    "contention_naive/lean": "48c4f9c193dcba649d7970387166c87c25fedaa0a164f23ba97b91bd7b3e21f3",
    "naive/record": "aa111ca121bec88ec23930cd814b2159c3655e0464bed1cc49c6a6639b5b5eac",
    "naive/lean": "db35b4dd4a94c51a1bbe695d477398e2bf9a801a8862d79d87c99eb43327c6b7",
    "wait/record": "85c1b4294605cebf14d280f2efd3a16e6b99a8de5e9181ab879dd6a6a0b76f39",
    "wait/lean": "bd4ff0be550b2b877926b1813d2ff18ef1b206fac1f09cced0ef0ec489a716b0",
    "zero_variance/record": "73a1c244371ffa68cf1b3419e8888f0f95e6037570ef4242fb0952272d77a7be",
    "zero_variance/lean": "7e6e48b7dfaa874c9e4de8f2e061a112132035e131260f13b43002009f17041d",
    "bench/durations": "81df69aea35247ad7f732936e2acafa31fff4a1e94b46a6a84b397855216e65c",
    "bench/contention": "6fda2328cc83875d10979d7671eccd08652c753a61c1dd6686d87fd24fb076e3",
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("record", [True, False])
def test_fixed_seed_simulation_reproduces_the_golden_digest(name: str, record: bool) -> None:
    assert _digest(name, record=record) == GOLDEN[f"{name}/{'record' if record else 'lean'}"]


@pytest.mark.parametrize("model", ["durations", "contention"])
def test_bench_scale_path_reproduces_the_golden_digest(model: str) -> None:
    assert _bench_digest(model) == GOLDEN[f"bench/{model}"]
