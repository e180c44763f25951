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
recompute it on the new code and say why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import fields
from typing import Any

import pytest

from rollbank.bench.schedule import add_arguments, episode_fn, scheduler_config
from rollbank.bench.schedule import capacity as bench_capacity
from rollbank.episodes.outcome import Reason
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.events import Event
from rollbank.scheduling.sim_model import LatencyProfile, SimCapacity, SimTurn
from rollbank.scheduling.simulate import SimEpisode, SimResult, simulate
from rollbank.scheduling.types import AttemptSpec, SchedulingMode, StragglerPolicy

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
    "abort/record": "00c8209f55b1ef4b4b527108c81e28cddc23d2d54864a7427e3cb5ac3b240538",
    "abort/lean": "3e5763073cc9c40b406ab65c42588d2d8985c7c8f2318e51778b558d2afb35b0",
    "carry/record": "f0de18ae6d03e37baa69d33669537678eb0e25a983a57043c6239f9a246f1779",
    "carry/lean": "76d58dd5d3478f496f934db81a72db4d10f43245bc8d3c1ebd11f79bd86705b2",
    "contention/record": "95e15384d59c49c2b988e27852125dcefd1d91d94c53a8ae836fe9ffdfe3cd13",
    "contention/lean": "e0601213159e110af8880a793743797a43b8fcd01869acfd32ddf9118e01e7d0",
    "contention_abort/record": "1f669083769168ff212b7bfe86c9ff3f45edd0b7b76c6d2fb2db13a9d94174b6",
    "contention_abort/lean": "ffbf0fe12e14688ca5da99acc4ecf3a28badc5e10cd3b15dad3055f338e8feda",
    "contention_naive/record": "8f99121869b5995c1f8dfd240b113a1fbfd02733f8aa0e2e89b1e8ab43ede5e5",
    "contention_naive/lean": "3b88e4fb5742de53a5d5f9de76eebeca587f357d6f7f0b823e0b3755b1084f79",
    "naive/record": "1f7d346ceabe50b10ef2fdc963c7bc3c9dbda9a2f5cab5274e203f345edfd8e7",
    "naive/lean": "47e12e6c286446e1f550c8af865fddd223e002ba9cb1f6f49639cbd482a3e7c8",
    "wait/record": "c079cba3d00c8b3a9cd4da0f7a670a2db74cdb32dd8b9e93e8c3d2ccbf998abc",
    "wait/lean": "ebb25b8534c9b20c7f64fc52ec2414dfb7ab14b7887eed8383bdbff621ce74f2",
    "zero_variance/record": "3f47f72230d52761f25ad7fc3a9926fc560fe521b22439c5abf2ca999aa62380",
    "zero_variance/lean": "de87b55a94da6a36d34405cfb7ec78fdb7efe8170f5630b764594bd653bacc3f",
    "bench/durations": "ecf2542308b117556e03356f331ca6ca4a54ed4b83494f6015b85b7dbf8bbbf4",
    "bench/contention": "1a1f45d34be54083f53e6a74506714189860fdd9d80e1d80aeeeeb1ef08b9a5b",
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("record", [True, False])
def test_fixed_seed_simulation_reproduces_the_golden_digest(name: str, record: bool) -> None:
    assert _digest(name, record=record) == GOLDEN[f"{name}/{'record' if record else 'lean'}"]


@pytest.mark.parametrize("model", ["durations", "contention"])
def test_bench_scale_path_reproduces_the_golden_digest(model: str) -> None:
    assert _bench_digest(model) == GOLDEN[f"bench/{model}"]
