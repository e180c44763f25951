"""Arrow schema v1 and the torch loader, in memory (no files)."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from rollbank.batching.batch import Batch
from rollbank.batching.loader import batch_tensors, iter_tensor_batches, table_to_tensors
from rollbank.batching.schema import (
    META_VERSION,
    SCHEMA,
    SCHEMA_VERSION,
    SchemaError,
    batch_to_table,
    check_schema,
)
from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.drivers.fake import FakePlan, make_trajectory
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import EmitBatch, Launch


def make_batch(groups: int = 2, n: int = 3, infra_slot: int | None = 1) -> Batch:
    """A real batch from the pure scheduler: slot ``infra_slot`` of group 0 fails for infra."""
    clock = FakeClock()
    s = Scheduler(
        SchedulerConfig(groups_per_batch=groups, pool_groups=groups,
                        bank=ReadyBankConfig(group_size=n, max_retries=0, min_valid=2)),
        ["task-a", "task-b"], clock,
    )
    specs = {d.spec.key: d.spec for d in s.poll() if isinstance(d, Launch)}
    out: list[Batch] = []
    for key in sorted(specs):
        clock.advance(1.0)
        if key.seq == 0 and key.slot == infra_slot:
            plan = FakePlan(Reason.SANDBOX_DIED, None)
        else:  # different lengths per slot, alternating rewards, carried-style mixed versions
            plan = FakePlan(Reason.VERIFIED_PASS if key.slot % 2 else Reason.VERIFIED_FAIL,
                            float(key.slot % 2), turns=1 + key.slot, version=key.slot)
        s.on_finished(key, make_trajectory(specs[key], plan, now=clock.now()))
        out += [d.batch for d in s.poll() if isinstance(d, EmitBatch)]
    [batch] = out
    return batch


def test_table_has_the_versioned_schema_and_one_row_per_valid_trajectory() -> None:
    batch = make_batch()
    table = batch_to_table(batch)
    assert table.schema.metadata[META_VERSION].decode() == SCHEMA_VERSION
    assert table.schema.remove_metadata() == SCHEMA.remove_metadata()
    assert table.num_rows == 5  # 3 + 3 siblings, one infra failure left out
    summary = check_schema(table.schema)
    assert summary["index"] == 0 and summary["trajectories"] == 5
    rows = table.to_pylist()
    assert [r["trajectory_id"] for r in rows[:2]] == ["g00000/s0/r0", "g00000/s2/r0"]
    assert {r["outcome"] for r in rows} <= {"model_success", "model_failure"}
    for r in rows:
        assert len(r["token_ids"]) == len(r["logprobs"]) == len(r["loss_mask"]) == r["num_tokens"]
        assert r["num_model_tokens"] == sum(r["loss_mask"])
        assert r["timings"]["duration_s"] == pytest.approx(
            r["timings"]["finished_at"] - r["timings"]["launched_at"])


def test_check_schema_refuses_other_versions_and_foreign_tables() -> None:
    table = batch_to_table(make_batch())
    meta = dict(table.schema.metadata)
    meta[META_VERSION] = b"3"
    with pytest.raises(SchemaError, match="version"):
        check_schema(table.schema.with_metadata(meta))
    with pytest.raises(SchemaError, match="not a rollbank"):
        check_schema(pa.schema([pa.field("x", pa.int32())]))


def test_tensors_are_right_padded_and_aligned_with_the_rows() -> None:
    batch = make_batch()
    table = batch_to_table(batch)
    tb = table_to_tensors(table, pad_id=-7)
    lengths = table.column("num_tokens").to_pylist()
    assert tb.input_ids.shape == (5, max(lengths))
    assert tb.input_ids.dtype == torch.int64 and tb.old_logprobs.dtype == torch.float32
    for i, n in enumerate(lengths):
        row = table.slice(i, 1).to_pylist()[0]
        assert tb.input_ids[i, :n].tolist() == row["token_ids"]
        assert (tb.input_ids[i, n:] == -7).all()
        assert tb.attention_mask[i].sum().item() == n
        assert tb.loss_mask[i, :n].tolist() == [float(m) for m in row["loss_mask"]]
        assert tb.policy_versions[i, :n].tolist() == row["policy_versions"]
        assert (tb.policy_versions[i, n:] == -1).all() and (tb.loss_mask[i, n:] == 0).all()
        assert tb.old_logprobs[i, :n].tolist() == pytest.approx(row["logprobs"])
    assert tb.advantages.tolist() == pytest.approx(table.column("advantage").to_pylist())
    assert tb.group_index.tolist() == [0, 0, 1, 1, 1]
    assert (tb.token_advantages == tb.advantages[:, None] * tb.loss_mask).all()


def test_micro_batches_cover_every_row_once_and_max_len_is_enforced() -> None:
    table = batch_to_table(make_batch())
    ids = [t for mb in iter_tensor_batches(table, 2) for t in mb.trajectory_ids]
    assert ids == table.column("trajectory_id").to_pylist()
    with pytest.raises(ValueError, match="max_len"):
        table_to_tensors(table, max_len=3)


def test_in_process_tensors_equal_the_table_path() -> None:
    batch = make_batch()
    a, b = batch_tensors(batch), table_to_tensors(batch_to_table(batch))
    assert torch.equal(a.input_ids, b.input_ids) and a.trajectory_ids == b.trajectory_ids
