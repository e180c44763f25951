"""Batch directories on real files, read back by a trainer in another process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rollbank.batching.batch import Batch
from rollbank.batching.loader import batch_tensors, read_batch_dir
from rollbank.batching.schema import SCHEMA, SCHEMA_VERSION, SchemaError, column_docs
from rollbank.batching.writer import (
    LATEST_NAME,
    MANIFEST_NAME,
    PARQUET_NAME,
    ready_batches,
    write_batch,
)
from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.drivers.fake import FakePlan, make_trajectory
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import EmitBatch, Launch

pytestmark = pytest.mark.integration


def _batches(count: int) -> list[Batch]:
    clock = FakeClock()
    s = Scheduler(
        SchedulerConfig(groups_per_batch=2, pool_groups=3, num_batches=count,
                        bank=ReadyBankConfig(group_size=3)),
        ["a", "b", "c"], clock,
    )
    specs = {}
    out: list[Batch] = []
    for _ in range(200):
        for d in s.poll():
            if isinstance(d, Launch):
                specs[d.spec.key] = d.spec
            elif isinstance(d, EmitBatch):
                out.append(d.batch)
        if s.done:
            return out
        key = min(s.running)
        clock.advance(1.0)
        plan = FakePlan(Reason.VERIFIED_PASS if key.slot else Reason.VERIFIED_FAIL,
                        float(key.slot > 0), turns=1 + key.seq % 3)
        s.on_finished(key, make_trajectory(specs[key], plan, now=clock.now()))
    raise AssertionError("collection did not finish")


def test_written_batches_are_complete_and_readable_in_another_process(tmp_path: Path) -> None:
    batches = _batches(2)
    for b in batches:
        write_batch(tmp_path, b, extra={"run": "test"})
    assert [p.name for p in ready_batches(tmp_path)] == ["batch-000000", "batch-000001"]
    assert (tmp_path / LATEST_NAME).read_text().strip() == "1"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left
    manifest = json.loads((tmp_path / "batch-000001" / MANIFEST_NAME).read_text())
    assert manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["rows"] == 6 and manifest["extra"] == {"run": "test"}
    assert manifest["batch"]["accounting"]["consumed"] == 6

    script = (
        "import sys, json; from pathlib import Path\n"
        "from rollbank.batching.loader import read_batch_dir, table_to_tensors\n"
        "from rollbank.batching.writer import ready_batches\n"
        "out = []\n"
        "for d in ready_batches(Path(sys.argv[1])):\n"
        "    tb = table_to_tensors(read_batch_dir(d))\n"
        "    out.append({'ids': list(tb.trajectory_ids), 'shape': list(tb.input_ids.shape),\n"
        "                'adv': tb.advantages.tolist(), 'mask': int(tb.loss_mask.sum())})\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)],
                          capture_output=True, text=True, check=True, timeout=120)
    remote = json.loads(proc.stdout)
    for b, r in zip(batches, remote, strict=True):
        local = batch_tensors(b)
        assert r["ids"] == list(local.trajectory_ids)
        assert r["shape"] == list(local.input_ids.shape)
        assert r["adv"] == pytest.approx(local.advantages.tolist())
        assert r["mask"] == int(local.loss_mask.sum())


def test_a_batch_is_written_once_and_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    [b] = _batches(1)
    write_batch(tmp_path, b)
    with pytest.raises(FileExistsError):
        write_batch(tmp_path, b)
    assert len(ready_batches(tmp_path)) == 1
    [b2] = _batches(1)
    broken = Batch(**{**b2.__dict__, "index": 7})
    broken.groups[0].trajectories[0].logprobs.append(0.0)  # per-token lengths now differ
    with pytest.raises(SchemaError, match="length"):
        write_batch(tmp_path, broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "batch-000000"]


def test_reader_detects_a_corrupted_parquet(tmp_path: Path) -> None:
    [b] = _batches(1)
    d = write_batch(tmp_path, b)
    table = pq.read_table(d / PARQUET_NAME)
    pq.write_table(table.slice(0, 2), d / PARQUET_NAME)
    with pytest.raises(SchemaError, match="sha256"):
        read_batch_dir(d)
    with pytest.raises(SchemaError, match="rows"):  # even unverified, the row count must match
        read_batch_dir(d, verify=False)


def test_a_written_batch_file_carries_the_column_docs(tmp_path: Path) -> None:
    [b] = _batches(1)
    d = write_batch(tmp_path, b)
    docs = column_docs(pq.read_schema(d / PARQUET_NAME))
    assert docs == column_docs(SCHEMA) and docs["advantage"]
