"""Column docs live once, as Arrow field metadata, and ship inside the Parquet file."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from rollbank.batching.batch import Batch
from rollbank.batching.schema import COLUMNS, SCHEMA, batch_to_table, column_docs, columns_table
from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.drivers.fake import FakePlan, make_trajectory
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import EmitBatch, Launch


def small_batch() -> Batch:
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(groups_per_batch=1, pool_groups=1,
                                  bank=ReadyBankConfig(group_size=2, max_retries=0, min_valid=2)),
                  ["task-a"], clock)
    specs = {d.spec.key: d.spec for d in s.poll() if isinstance(d, Launch)}
    out: list[Batch] = []
    for key in sorted(specs):
        clock.advance(1.0)
        plan = FakePlan(Reason.VERIFIED_PASS if key.slot else Reason.VERIFIED_FAIL,
                        float(key.slot), turns=1)
        s.on_finished(key, make_trajectory(specs[key], plan, now=clock.now()))
        out += [d.batch for d in s.poll() if isinstance(d, EmitBatch)]
    [batch] = out
    return batch


def test_every_column_has_a_doc_in_the_schema() -> None:
    docs = column_docs()
    assert list(docs) == [name for name, _, _ in COLUMNS] == SCHEMA.names
    assert all(docs.values())
    assert docs["loss_mask"] == "1: sampled by the model (trainable), 0: prompt/env"


def test_a_written_parquet_file_carries_the_column_docs() -> None:
    table = batch_to_table(small_batch())
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    read = pq.read_table(pa.BufferReader(sink.getvalue()))
    assert read.num_rows == 2
    assert column_docs(read.schema) == column_docs(SCHEMA)


def test_the_docs_table_is_generated_from_the_schema() -> None:
    text = columns_table()
    lines = text.splitlines()
    assert len(lines) == len(SCHEMA)
    assert lines[0].split()[:2] == ["trajectory_id", "string"]
    assert "advantage" in text and "GRPO advantage over the group's valid siblings" in text
