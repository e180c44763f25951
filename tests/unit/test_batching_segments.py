"""Schema 2.1 ``segment_starts``: written from a trajectory's segments, read as per-token
segment ids, a 2.0 file upgraded with one segment, a contradictory one refused."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_fuzz_files import fresh, rewrite

from rollbank.batching.loader import BatchFileError, read_batch_dir, table_to_tensors
from rollbank.batching.schema import META_UPGRADED, META_VERSION, MINOR_COLUMNS, SCHEMA_VERSION
from rollbank.batching.writer import PARQUET_NAME


def _with_starts(table: pa.Table, starts: list[int]) -> pa.Table:
    i = table.schema.get_field_index("segment_starts")
    rows = table.column("segment_starts").to_pylist()
    rows[0] = starts
    return table.set_column(i, table.schema.field(i), pa.array(rows, type=table.schema.field(i).type))


def test_segments_round_trip_as_segment_ids(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    path = fresh(tmp_path)
    table = pq.read_table(path / PARQUET_NAME)
    assert table.schema.metadata[META_VERSION] == SCHEMA_VERSION.encode() == b"2.1"
    assert set(map(tuple, table.column("segment_starts").to_pylist())) == {(0,)}
    n = table.column("num_tokens").to_pylist()[0]
    rewrite(path, _with_starts(table, [0, n // 2]))
    tb = table_to_tensors(read_batch_dir(path))
    assert tb.segment_ids is not None
    row = tb.segment_ids[0, :n].tolist()
    assert row == [0] * (n // 2) + [1] * (n - n // 2)
    assert (tb.segment_ids[0, n:] == -1).all()


def test_a_2_0_file_is_read_with_one_segment_per_row(tmp_path: Path) -> None:
    path = fresh(tmp_path)
    table = pq.read_table(path / PARQUET_NAME)
    old = table.drop_columns(list(MINOR_COLUMNS))
    rewrite(path, old.replace_schema_metadata({**table.schema.metadata, META_VERSION: b"2"}))
    read = read_batch_dir(path)
    assert read.column("segment_starts").to_pylist() == [[0]] * read.num_rows
    assert read.schema.metadata[META_UPGRADED] == b"2"


@pytest.mark.parametrize("starts", [[], [1], [0, 0], [0, 10**6]])
def test_contradictory_segment_starts_are_refused(tmp_path: Path, starts: list[int]) -> None:
    path = fresh(tmp_path)
    rewrite(path, _with_starts(pq.read_table(path / PARQUET_NAME), starts))
    with pytest.raises(BatchFileError, match="segment_starts"):
        read_batch_dir(path)
