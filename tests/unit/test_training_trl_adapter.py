"""The TRL adapter without TRL: column mapping, whole groups, sources, the live stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rollbank.batching.batch import (
    Batch,
    BatchAccounting,
    DistStats,
    GroupResult,
    SelectionProfile,
)
from rollbank.batching.schema import SchemaError
from rollbank.batching.writer import write_batch
from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.errors import ConfigError
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.drivers.driver import CollectionDriver
from rollbank.scheduling.drivers.fake import FakeAttemptRunner, FakePlan
from rollbank.scheduling.policy.types import AttemptSpec
from rollbank.training.trl_adapter import (
    BatchStream,
    RollbankRollouts,
    RolloutsExhaustedError,
    groups_from_batch_dirs,
    groups_from_batches,
    rollbank_advantage,
    rollbank_reward,
)

PAD = 0


def _trainer(g: int = 2) -> Any:
    """What the adapter reads from a GRPOTrainer."""
    return SimpleNamespace(num_generations=g, num_generations_eval=g,
                           model=SimpleNamespace(training=True),
                           processing_class=SimpleNamespace(pad_token_id=PAD))


def _traj(gid: str, slot: int, reward: float, *, reason: Reason | None = None,
          turns: int = 2) -> Trajectory:
    t = Trajectory(trajectory_id=f"{gid}/s{slot}/r0", group_id=gid, task_id=f"task-{gid}",
                   attempt=slot)
    t.append_prompt([1, 2, 3])
    t.prompt_len = 3
    for k in range(turns):
        t.append_model([10 + slot, 20 + k], [-0.25 - slot, -0.5 - k], version=k)
        t.append_prompt([7])  # observation
    default = Reason.VERIFIED_PASS if reward else Reason.VERIFIED_FAIL
    t.outcome = EpisodeOutcome.of(reason or default, reward=reward)
    return t


def _group(gid: str, trajs: list[Trajectory], size: int = 2) -> GroupResult:
    rewards = tuple(t.outcome.reward or 0.0 for t in trajs if t.outcome is not None)
    mean = sum(rewards) / len(rewards)
    adv = tuple(r - mean for r in rewards)
    return GroupResult(gid, f"task-{gid}", 0, tuple(trajs), rewards, adv, len(set(rewards)) == 1,
                       size, size - len(trajs), 0, 0.0, 1.0)


def _batch(index: int, *groups: GroupResult) -> Batch:
    d = DistStats(1, 1.0, 1.0, 1.0, 1.0)
    return Batch(index, groups, BatchAccounting(4, 4, 0, 0, 0, 0),
                 SelectionProfile(d, d, d, d, 0.5, 0.5, 0, d), 0.0, 1.0, True)


def _pair(gid: str) -> GroupResult:
    return _group(gid, [_traj(gid, 0, 1.0), _traj(gid, 1, 0.0)])


def test_rows_map_to_trl_fields_group_by_group() -> None:
    rollouts = RollbankRollouts(groups_from_batches([_batch(0, _pair("a"), _pair("b"))]))
    out = rollouts(["p", "p", "q", "q"], _trainer())
    assert out["rollbank_trajectory_id"] == ["a/s0/r0", "a/s1/r0", "b/s0/r0", "b/s1/r0"]
    assert out["rollbank_group_id"] == ["a", "a", "b", "b"]
    assert out["prompt_ids"][1] == [1, 2, 3]
    # completion = every token after the prompt; env_mask = rollbank's loss mask there
    assert out["completion_ids"][1] == [11, 20, 7, 11, 21, 7]
    assert out["env_mask"][1] == [1, 1, 0, 1, 1, 0]
    assert out["logprobs"][1] == [-1.25, -0.5, 0.0, -1.25, -1.5, 0.0]
    assert out["rollbank_max_version"][1] == 1
    assert rollbank_reward([], [], **out) == [1.0, 0.0, 1.0, 0.0]
    assert rollbank_advantage([], [], **out) == [0.5, -0.5, 0.5, -0.5]
    assert [g.group_id for g in rollouts.served] == ["a", "b"]


def test_a_group_short_of_valid_siblings_is_skipped_whole() -> None:
    short = _group("s", [_traj("s", 1, 0.0)])  # slot 0 stayed infra-failed
    rollouts = RollbankRollouts(groups_from_batches([_batch(0, short, _pair("b"))]))
    out = rollouts(["p", "p"], _trainer())
    assert out["rollbank_group_id"] == ["b", "b"] and rollouts.skipped == ["s"]
    with pytest.raises(RolloutsExhaustedError):
        rollouts(["p", "p"], _trainer())


def test_infra_rows_group_size_and_prompt_count_are_refused() -> None:
    bad = _group("x", [_traj("x", 0, 1.0), _traj("x", 1, 0.0, reason=Reason.INFERENCE_ERROR)])
    with pytest.raises(SchemaError, match="not trainable"):
        list(groups_from_batches([_batch(0, bad)]))
    with pytest.raises(ConfigError, match="num_generations"):
        RollbankRollouts(groups_from_batches([_batch(0, _pair("a"))]))(["p"] * 4, _trainer(4))
    with pytest.raises(ValueError, match="multiple"):
        RollbankRollouts(groups_from_batches([_batch(0, _pair("a"))]))(["p"] * 3, _trainer())


def test_a_completion_without_tokens_becomes_one_masked_pad() -> None:
    g = _group("e", [_traj("e", 0, 1.0), _traj("e", 1, 0.0, turns=0)])
    out = RollbankRollouts(groups_from_batches([_batch(0, g)]))(["p", "p"], _trainer())
    assert out["completion_ids"][1] == [PAD] and out["env_mask"][1] == [0]
    assert out["logprobs"][1] == [0.0] and out["prompt_ids"][1] == [1, 2, 3]


def test_batch_dirs_are_read_in_order_and_followed_while_written(tmp_path: Path) -> None:
    root = tmp_path / "batches"
    write_batch(root, _batch(0, _pair("a")))
    slept: list[float] = []

    def sleep(s: float) -> None:  # the collection writes its next batch meanwhile
        slept.append(s)
        if len(slept) == 1:
            write_batch(root, _batch(1, _pair("b"), _pair("c")))

    groups = groups_from_batch_dirs(root, wait_s=1.0, poll_s=0.5, sleep=sleep)
    assert [g.group_id for g in groups] == ["a", "b", "c"]
    assert slept == [0.5, 0.5, 0.5]  # one wait for batch 1, then wait_s for batch 2
    assert [g.group_id for g in groups_from_batch_dirs(root, start=1)] == ["b", "c"]


def _alternating(spec: AttemptSpec) -> FakePlan:
    return FakePlan(Reason.VERIFIED_PASS if spec.slot % 2 else Reason.VERIFIED_FAIL,
                    reward=float(spec.slot % 2))


def test_stream_serves_a_live_collection_to_a_sync_consumer_and_stops_it() -> None:
    runner = FakeAttemptRunner(_alternating)
    config = SchedulerConfig(bank=ReadyBankConfig(group_size=2), groups_per_batch=1,
                             pool_groups=2, sandbox_slots=4, num_batches=8)
    driver = CollectionDriver(config, runner, ["t0", "t1"])
    with BatchStream(driver.batches) as stream:
        rollouts = RollbankRollouts(groups_from_batches(stream))
        out = rollouts(["p"] * 4, _trainer())
        thread = stream._thread
    assert not thread.is_alive()
    assert len(set(out["rollbank_group_id"])) == 2
    assert all(r.reward == float(i % 2) for g in rollouts.served for i, r in enumerate(g.rows))
    # the consumer stopped early: collection stopped too, and every attempt was settled
    assert len(driver.batches_out) < 8
    assert sorted(runner.finished + runner.cancelled) == sorted(runner.started)


def test_stream_raises_the_source_error_after_its_batches() -> None:
    async def failing() -> AsyncGenerator[Batch, None]:
        yield _batch(0, _pair("a"))
        await asyncio.sleep(0)
        raise RuntimeError("collection stalled")

    with BatchStream(failing) as stream:
        assert next(stream).index == 0
        with pytest.raises(RuntimeError, match="stalled"):
            next(stream)
        with pytest.raises(StopIteration):
            next(stream)
