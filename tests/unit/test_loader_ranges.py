"""The batch loader refuses out-of-range per-token values (issue 24, defect 6): a
``loss_mask`` of 7 would weight a token's gradient x7, a negative token id indexes the
embedding from the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_fuzz_files import fresh, rewrite

from rollbank.batching.loader import BatchFileError, read_batch_dir
from rollbank.batching.writer import PARQUET_NAME


def _set_token(table: Any, column: str, value: int) -> Any:
    i = table.schema.get_field_index(column)
    rows = table.column(column).to_pylist()
    rows[0] = [value, *rows[0][1:]]
    field = table.schema.field(i)
    return table.set_column(i, field, pa.array(rows, type=field.type))


@pytest.mark.parametrize("column,value", [
    ("loss_mask", 7), ("loss_mask", -1), ("is_keep", 2), ("token_ids", -5),
    ("policy_versions", -2),
])
def test_out_of_range_token_values_are_refused(tmp_path: Path, column: str, value: int) -> None:
    path = fresh(tmp_path)
    rewrite(path, _set_token(pq.read_table(path / PARQUET_NAME), column, value))
    with pytest.raises(BatchFileError, match=column) as exc:
        read_batch_dir(path)
    assert exc.value.field == column and str(value) in str(exc.value)


def test_in_range_values_still_load(tmp_path: Path) -> None:
    path = fresh(tmp_path)
    rewrite(path, _set_token(pq.read_table(path / PARQUET_NAME), "loss_mask", 1))
    assert read_batch_dir(path).num_rows > 0
